"""Geo sampling: random patches from ``landsat8 & cdl`` -- pipekit vs TorchGeo vs plain rasterio, local and S3.

What is measured (issue 3, "Speed" and "From S3"):

1. **Corpus**: :func:`pipekit.synthetic.geo.write_landsat_cdl_corpus` (Landsat 8
   Collection 2 band files, tiled 256 DEFLATE uint16 in UTM 15N, and a CDL
   raster in CONUS Albers, uint8), cached under ``pipekit.synthetic.default_cache_dir()``.
2. **Sampling**: random 256 px patches of ``Landsat8(bands=all_bands[1:-2]) &
   CDL`` (six reflective bands, CDL reprojected onto the Landsat grid), through a
   ``torch.utils.data.DataLoader`` (``sampler=``, ``collate_fn=stack_samples``,
   batch size 8) with 0 and 2 workers, for:

   * **pipekit**: ``datasets.Landsat8 & datasets.CDL`` with ``pipekit.geo.RandomGeoSampler``;
   * **TorchGeo** (0.8, the ``bench`` extra): its own ``Landsat8 & CDL``,
     ``RandomGeoSampler`` (same size and length) and ``stack_samples``, on the same files;
   * **floor**: plain rasterio with handles opened once per process: the six
     band windows read natively (``src.read(1, window=..., out=...)``) and the CDL
     window read from an open ``rasterio.vrt.WarpedVRT`` of the CDL file onto the
     Landsat UTM grid (nearest), the fastest plain-rasterio reprojection measured
     (a ``rasterio.warp.reproject`` per patch is ~10x slower); converted to the
     same float32 image / int64 mask tensors.  It reads the same boxes as pipekit
     (an identically seeded ``RandomGeoSampler``).
   * with ``--pool-off-row``, with workers: **pipekit, shm pool off**, pipekit
     with ``PIPEKIT_SHM_POOL=0`` (every batch in fresh shared memory instead of
     a buffer the main process has released, :mod:`pipekit._shm`).

   Each (contender, workers, GDAL cache) runs in a fresh Python process: a
   first pass (warm-up: opens files, fills GDAL's block cache, starts workers)
   and a second pass over fresh boxes of the same count, which is the number
   reported, as samples/s and as CPU time per sample (of the process and its
   workers: steadier than wall time on a shared machine).  Two GDAL block-cache
   regimes, the same for all contenders: **cached** (``GDAL_CACHEMAX`` 512 MiB,
   above each contender's ~240 MiB working set: the second pass decodes almost
   no tile) and **uncached** (8 MiB: every patch decodes its tiles, as with
   corpora much larger than the cache).  Ratios: pipekit/TorchGeo (target >= 5x,
   issue 34) and floor/pipekit (target <= 1.3x).  ``--torch-threads 1`` runs the
   0-worker loaders with one torch thread (``torch.set_num_threads``; workers
   have one anyway): on a loaded 2-core machine the collate's ``torch.stack`` on
   two threads spins for milliseconds a batch, whoever's samples it stacks.
   A check compares pipekit's samples with
   the floor's (image identical, mask agreement) and with
   ``rasterio.warp.reproject`` of the CDL window.

3. **Index**: 10,000 tiny GeoTIFFs (16 px, UTM 15N, dated names, on a grid of
   footprints) written once into the cache; the time to build ``RasterDataset``
   over 1,000 and 10,000 of them (pipekit vs TorchGeo's ``RasterDataset(paths=...)``),
   the pickled size, and the cost of one query of a ~2x2-file box
   (``dataset.geo_index.query(bbox)`` vs TorchGeo's own ``IntervalIndex.overlaps`` +
   ``GeoDataFrame.cx`` selection), both checked to find the same files.

4. **From S3**: the corpus's files (six bands of both scenes and the CDL)
   converted to Cloud-Optimized GeoTIFFs (DEFLATE, 512 px tiles, overviews),
   uploaded to a real local S3 server (SeaweedFS, ``tests/s3server.py``) and read
   as ``Landsat8(root="s3://bucket/landsat8/", storage_options=...) & CDL(root="s3://bucket/cdl/", ...)``
   through GDAL's ``/vsis3/`` (pipekit's default) and through fsspec
   (``vsi=False``), against the same COGs on local disk, with 0 workers: once
   with pipekit's caches (its ``GDAL_CACHEMAX``, /vsicurl/'s region cache) and
   once with them off (8 MiB block cache, ``VSI_CACHE=FALSE`` and
   ``CPL_VSIL_CURL_NON_CACHED`` through ``gdal_options=``).  A counting TCP proxy
   on 127.0.0.1 in front of the S3 port counts the bytes received, for GDAL's
   and fsspec's requests alike; they are compared with the compressed size (the
   COG's TileByteCounts) of the full-resolution tiles each patch touches
   (target: within 2x), and with the tiles no earlier patch had touched (what a
   reader that never fetched a tile twice would need).

Run: ``./run bench geo_sampling`` (about 6 minutes on 2 cores; ``--quick`` for a
smoke run of about a minute, ``--skip-torchgeo``, ``--skip-s3``, ``--skip-index``,
``--profile`` for per-layer times and a cProfile of pipekit's reads; ``--help``
for the rest).  Without TorchGeo installed its rows are skipped.  Timings on a
shared machine are noisy: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import hashlib
import importlib.util
import io
import json
import math
import os
import pickle
import platform
import pstats
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import torch
from affine import Affine
from rasterio.enums import Resampling
from rasterio.env import set_gdal_config
from rasterio.warp import transform_bounds
from rasterio.windows import Window
from torch.utils.data import DataLoader, Dataset

from pipekit.geo import RasterDataset

BANDS = ("SR_B2", "SR_B3", "SR_B4", "SR_B5", "SR_B6", "SR_B7")  # Landsat8.all_bands[1:-2]
PATCH = 256
RESULT = "@@RESULT@@ "
MIB = 2**20
REPO = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------------- helpers


def have_torchgeo() -> bool:
    return importlib.util.find_spec("torchgeo") is not None


def configure_gdal(cachemax_mib: int | None) -> None:
    """The same process configuration for every contender: pipekit's GDAL options, with this block cache size,
    and pipekit's allocator tuning (:mod:`pipekit.malloc`, which pipekit applies in processes that read rasters).

    ``None`` keeps pipekit's own ``GDAL_CACHEMAX``.
    """
    import pipekit.geo.io as geo_io
    from pipekit import malloc

    malloc.tune()

    if cachemax_mib is not None:
        geo_io.GDAL_OPTIONS["GDAL_CACHEMAX"] = cachemax_mib * MIB  # pipekit applies these at its first open
    for key, value in geo_io.GDAL_OPTIONS.items():
        set_gdal_config(key, value)


def pipekit_cachemax() -> int:
    """pipekit's own GDAL_CACHEMAX, in MiB."""
    import pipekit.geo.io as geo_io

    return int(geo_io.GDAL_OPTIONS["GDAL_CACHEMAX"]) // MIB


def fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.2f}x"


def verdict(ok: bool | None) -> str:
    return "" if ok is None else ("ok" if ok else "MISS")


def table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = indent + "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths)))
    out = [line, indent + "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append(indent + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(out)


def run_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter (its own GDAL cache, heap and handles)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_child", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT) :])
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
    return {"error": f"exit code {proc.returncode}: {tail}"}


# ------------------------------------------------------------------------------------------ corpus


def scene_table(root: Path) -> list[dict[str, Any]]:
    """The Landsat scenes of the corpus: band paths, day interval (POSIX seconds), bounds."""
    scenes = []
    for folder in sorted((root / "landsat8").iterdir()):
        if not folder.is_dir():
            continue
        name = folder.name
        day = datetime.strptime(name.split("_")[3], "%Y%m%d").replace(tzinfo=timezone.utc).timestamp()
        paths = [str(folder / f"{name}_{band}.TIF") for band in BANDS]
        with rasterio.open(paths[0]) as src:
            b = src.bounds
        scenes.append(
            {"paths": paths, "mint": day, "maxt": day + 86400 - 1e-6, "bounds": (b.left, b.bottom, b.right, b.top)}
        )
    return scenes


def pipekit_dataset(
    root: Path | str,
    storage_options: dict | None = None,
    vsi: bool | None = None,
    gdal_options: dict | None = None,
    cache_dir: str | None = None,
):
    """``Landsat8(bands=all_bands[1:-2]) & CDL`` of the corpus at ``root`` (a folder or an ``s3://`` URL)."""
    from pipekit import datasets

    extra: dict[str, Any] = {}
    if storage_options is not None:
        extra = {"storage_options": storage_options, "vsi": vsi, "gdal_options": gdal_options}
    if cache_dir is not None:
        extra["cache_dir"] = cache_dir
    sep = "/" if isinstance(root, str) and "://" in root else os.sep
    base = str(root).rstrip("/")
    landsat = datasets.Landsat8(root=f"{base}{sep}landsat8{sep}", bands=datasets.Landsat8.all_bands[1:-2], **extra)
    cdl = datasets.CDL(root=f"{base}{sep}cdl{sep}", **extra)
    return landsat & cdl


# ------------------------------------------------------------------------------------------- floor


class FloorDataset(Dataset):
    """Plain rasterio reads of a query box: native windows of the band files, CDL through an open WarpedVRT.

    Holds no handle when pickled: each process opens the files once, at its
    first read, and keeps them open.
    """

    def __init__(self, root: Path) -> None:
        self.scenes = scene_table(root)
        self.cdl_path = str(root / "cdl" / "2023_30m_cdls.tif")
        with rasterio.open(self.scenes[0]["paths"][0]) as src:
            self.crs = src.crs
            self.res = src.res
            self.origin = (src.transform.c, src.transform.f)
        self._open: tuple[int, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_open"] = None
        return state

    def _handles(self) -> dict[str, Any]:
        if self._open is not None and self._open[0] == os.getpid():
            return self._open[1]
        from rasterio.vrt import WarpedVRT

        bands = [[rasterio.open(p) for p in scene["paths"]] for scene in self.scenes]
        cdl = rasterio.open(self.cdl_path)
        # the VRT's grid: the Landsat grid (same origin modulo the pixel size), covering the CDL
        xres, yres = self.res
        left, bottom, right, top = transform_bounds(cdl.crs, self.crs, *cdl.bounds, densify_pts=21)
        ox, oy = self.origin
        left = ox + math.floor((left - ox) / xres) * xres
        top = oy + math.ceil((top - oy) / yres) * yres
        width = math.ceil((right - left) / xres)
        height = math.ceil((top - bottom) / yres)
        vrt = WarpedVRT(
            cdl,
            crs=self.crs,
            transform=Affine(xres, 0, left, 0, -yres, top),
            width=width,
            height=height,
            resampling=Resampling.nearest,
        )
        handles = {"bands": bands, "cdl": cdl, "vrt": vrt, "vrt_origin": (left, top)}
        self._open = (os.getpid(), handles)
        return handles

    def __getitem__(self, bbox: Any) -> dict[str, Any]:
        from pipekit.geo._bbox import from_slices

        bbox = from_slices(bbox)  # sampler items are TorchGeo 0.8 slices (x, y, t)
        h = self._handles()
        xres, yres = self.res
        files = None
        for scene, handles in zip(self.scenes, h["bands"]):
            sl, sb, sr, st = scene["bounds"]
            if (
                scene["mint"] <= bbox.mint_s <= scene["maxt"]
                and sl <= bbox.minx
                and bbox.maxx <= sr
                and sb <= bbox.miny
                and bbox.maxy <= st
            ):
                files = handles
                break
        if files is None:
            raise IndexError(f"no scene covers {bbox}")
        width = round((bbox.maxx - bbox.minx) / xres)
        height = round((bbox.maxy - bbox.miny) / yres)
        t = files[0].transform
        window = Window(round((bbox.minx - t.c) / xres), round((t.f - bbox.maxy) / yres), width, height)
        image = np.empty((len(files), height, width), dtype=np.uint16)
        for i, src in enumerate(files):
            src.read(1, window=window, out=image[i])
        vl, vt = h["vrt_origin"]
        mask = h["vrt"].read(
            1, window=Window(round((bbox.minx - vl) / xres), round((vt - bbox.maxy) / yres), width, height)
        )
        return {
            "image": torch.from_numpy(image.astype(np.float32)),
            "mask": torch.from_numpy(mask.astype(np.int64)),
            "crs": self.crs,
            "bounds": bbox,
            "transform": Affine(xres, 0, bbox.minx, 0, -yres, bbox.maxy),
        }


# ----------------------------------------------------------------------------- sampling (children)


def boxes_digest(boxes: list[Any]) -> str:
    h = hashlib.sha1()
    from pipekit.geo._bbox import from_slices

    for b in boxes:  # BoundingBoxes or TorchGeo 0.8 slices: the same digest for the same box
        h.update(repr(tuple(round(float(v), 6) for v in from_slices(b).seconds())).encode())
    return h.hexdigest()[:12]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of processes (all their threads), from ``/proc`` (0 where unavailable)."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


def timed_passes(loader: DataLoader, keep_bounds: bool) -> dict[str, Any]:
    """Two epochs of ``loader``: a warm-up and the measured one (wall time, and CPU time of all its processes)."""
    out: dict[str, Any] = {}
    for name in ("pass1", "pass2"):
        n = 0
        bounds: list[Any] = []
        shapes = None
        start = time.perf_counter()
        it = iter(loader)
        pids = [os.getpid()] + [w.pid for w in getattr(it, "_workers", [])]
        cpu = cpu_seconds(pids)
        for batch in it:
            n += batch["image"].shape[0]
            if shapes is None:
                shapes = [
                    list(batch["image"].shape),
                    list(batch["mask"].shape),
                    str(batch["image"].dtype),
                    str(batch["mask"].dtype),
                ]
            if keep_bounds:
                bounds.extend(batch["bounds"])
        cpu = cpu_seconds(pids) - cpu
        elapsed = time.perf_counter() - start
        out[name] = {
            "samples": n,
            "seconds": elapsed,
            "rate": n / elapsed,
            "cpu_ms": 1e3 * cpu / n,
            "shapes": shapes,
            "digest": boxes_digest(bounds) if keep_bounds else None,
        }
    return out


def child_sampling(spec: dict[str, Any]) -> dict[str, Any]:
    configure_gdal(spec["cachemax"])
    root = Path(spec["root"])
    n, batch_size, workers, seed = spec["length"], spec["batch_size"], spec["workers"], spec["seed"]
    kind = spec["kind"]
    if kind == "pipekit-nopool":  # pipekit with fresh shared memory for every batch in workers (pipekit._shm off)
        from pipekit import _shm as shm

        os.environ[shm.ENV_VAR] = "0"  # the workers inherit it
        kind = "pipekit"
    t0 = time.perf_counter()
    if kind in ("pipekit", "floor"):
        from pipekit.geo import RandomGeoSampler, stack_samples

        ds = pipekit_dataset(root)
        sampler = RandomGeoSampler(ds, size=PATCH, length=n, seed=seed)
        data: Dataset = ds if kind == "pipekit" else FloorDataset(root)
        collate = stack_samples
    else:
        import torchgeo.datasets as tgd
        from torchgeo.samplers import RandomGeoSampler as TGRandomGeoSampler

        with contextlib.redirect_stdout(io.StringIO()):  # TorchGeo prints its CRS conversions
            landsat = tgd.Landsat8(paths=str(root / "landsat8"), bands=list(BANDS))
            cdl = tgd.CDL(paths=str(root / "cdl"), years=[2023])
            data = landsat & cdl
        sampler = TGRandomGeoSampler(data, size=PATCH, length=n, generator=torch.Generator().manual_seed(seed))
        collate = tgd.stack_samples
    build = time.perf_counter() - t0
    if spec.get("torch_threads"):
        torch.set_num_threads(int(spec["torch_threads"]))
    loader = DataLoader(
        data,
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=collate,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    result = timed_passes(loader, keep_bounds=kind != "torchgeo")
    result["build"] = build
    return result


# --------------------------------------------------------------------------------- sampling (parent)


def sampling_section(args: argparse.Namespace, root: Path, torchgeo: bool) -> dict[str, Any]:
    print(f"\n== 2. Random {PATCH} px patches of landsat8 & cdl: DataLoader(batch_size={args.batch_size}) ==")
    regimes = [("cached", args.cachemax, args.length)]
    if not args.cached_only:
        regimes.append(("uncached", args.small_cachemax, args.uncached_length))
    summary: dict[str, Any] = {}
    for regime, cachemax, length in regimes:
        for workers in args.workers:
            kinds = (
                ["floor", "pipekit"]
                + (["pipekit-nopool"] if args.pool_off_row and workers else [])
                + (["torchgeo"] if torchgeo else [])
            )
            results = {}
            for kind in kinds:
                spec = {
                    "mode": "sampling",
                    "kind": kind,
                    "root": str(root),
                    "length": length,
                    "batch_size": args.batch_size,
                    "workers": workers,
                    "seed": args.seed,
                    "cachemax": cachemax,
                    "torch_threads": args.torch_threads,
                }
                results[kind] = run_child(spec, timeout=args.child_timeout)
            summary[(regime, workers)] = results
            print(f"\n  GDAL_CACHEMAX {cachemax} MiB ({regime}), {workers} worker(s), {length} samples per pass:")
            rows = []
            for kind in kinds:
                r = results[kind]
                label = {
                    "floor": "floor (plain rasterio)",
                    "pipekit": "pipekit",
                    "pipekit-nopool": "pipekit, shm pool off",
                    "torchgeo": "TorchGeo 0.8",
                }[kind]
                if "error" in r:
                    rows.append([label, "error", "", "", "", ""])
                    print(f"    {label}: {r['error']}")
                    continue
                image, mask, image_dtype, mask_dtype = r["pass2"]["shapes"]
                batch = f"{image} {image_dtype.replace('torch.', '')}, {mask} {mask_dtype.replace('torch.', '')}"
                rows.append(
                    [
                        label,
                        f"{r['build']:.2f}",
                        fmt_rate(r["pass1"]["rate"]),
                        fmt_rate(r["pass2"]["rate"]),
                        f"{r['pass2']['cpu_ms']:.2f}",
                        batch,
                    ]
                )
            print(table(["", "build s", "pass 1 /s", "pass 2 /s", "CPU ms/sample", "batch"], rows, indent="    "))
            ok = {k: results[k]["pass2"] for k in kinds if "error" not in results[k]}
            lines = []
            if "pipekit" in ok and "torchgeo" in ok:
                x = ok["pipekit"]["rate"] / ok["torchgeo"]["rate"]
                c = ok["torchgeo"]["cpu_ms"] / ok["pipekit"]["cpu_ms"]
                lines.append(
                    f"pipekit / TorchGeo = {fmt_ratio(x)} (target >= 5x: {verdict(x >= 5)}); "
                    f"by CPU time per sample {fmt_ratio(c)}"
                )
            if "pipekit" in ok and "pipekit-nopool" in ok:
                x = ok["pipekit"]["rate"] / ok["pipekit-nopool"]["rate"]
                c = ok["pipekit-nopool"]["cpu_ms"] / ok["pipekit"]["cpu_ms"]
                lines.append(f"pipekit shm pool on / off = {fmt_ratio(x)}; by CPU time per sample {fmt_ratio(c)}")
            if "pipekit" in ok and "floor" in ok:
                x = ok["floor"]["rate"] / ok["pipekit"]["rate"]
                c = ok["pipekit"]["cpu_ms"] / ok["floor"]["cpu_ms"]
                lines.append(
                    f"floor / pipekit = {fmt_ratio(x)} (target <= 1.3x: {verdict(x <= 1.3)}); "
                    f"by CPU time per sample {fmt_ratio(c)}"
                )
                same = ok["pipekit"]["digest"] == ok["floor"]["digest"]
                lines.append(f"pipekit and floor read the same boxes: {'yes' if same else 'NO'}")
            for line in lines:
                print("    " + line)
    return summary


def agreement_check(root: Path, n: int, seed: int) -> None:
    """pipekit vs the floor vs ``rasterio.warp.reproject`` on a few boxes."""
    from rasterio.warp import reproject

    from pipekit import datasets
    from pipekit.geo import RandomGeoSampler

    ds = pipekit_dataset(root)
    floor = FloorDataset(root)
    # pipekit's CDL gives TorchGeo's ordinal labels: map the raw codes of the floor and of GDAL the same way
    ordinal = torch.as_tensor(datasets.CDL(root=str(root / "cdl")).ordinal_map)
    boxes = list(RandomGeoSampler(ds, size=PATCH, length=n, seed=seed + 1000))
    same_image = 0
    vs_floor, vs_reproject, floor_vs_reproject = [], [], []
    with rasterio.open(floor.cdl_path) as cdl:
        for b in boxes:
            a, f = ds[b], floor[b]
            same_image += bool(torch.equal(a["image"], f["image"]))
            ref = np.zeros((PATCH, PATCH), dtype=np.uint8)
            reproject(
                rasterio.band(cdl, 1),
                ref,
                dst_transform=a["transform"],
                dst_crs=ds.crs,
                resampling=Resampling.nearest,
                num_threads=1,
            )
            ref_t = ordinal[torch.from_numpy(ref.astype(np.int64))]
            floor_mask = ordinal[f["mask"]]
            vs_floor.append(float((a["mask"] == floor_mask).float().mean()))
            vs_reproject.append(float((a["mask"] == ref_t).float().mean()))
            floor_vs_reproject.append(float((floor_mask == ref_t).float().mean()))
    print(
        f"\n  check on {n} boxes: pipekit image == floor image: {same_image}/{n}; mask agreement: "
        f"pipekit vs floor {100 * np.mean(vs_floor):.2f}% (min {100 * min(vs_floor):.2f}%), "
        f"pipekit vs rasterio.warp.reproject {100 * np.mean(vs_reproject):.2f}% "
        f"(min {100 * min(vs_reproject):.2f}%), floor's WarpedVRT vs reproject "
        f"{100 * np.mean(floor_vs_reproject):.2f}%"
    )


def child_profile(spec: dict[str, Any]) -> dict[str, Any]:
    """Per-layer times and a cProfile of pipekit's reads (0 workers, no DataLoader, after a warm-up pass)."""
    import resource

    from pipekit.geo import RandomGeoSampler

    configure_gdal(spec["cachemax"])
    n = spec["length"]
    ds = pipekit_dataset(Path(spec["root"]))
    sampler = RandomGeoSampler(ds, size=PATCH, length=n, seed=spec["seed"])
    warm, boxes = list(sampler), list(sampler)
    for b in warm:
        ds[b]
    floor = FloorDataset(Path(spec["root"]))
    for b in warm:
        floor[b]
    # CPU time per warm sample of dataset[box], pipekit and the floor alternately: median of 5 passes
    cpu: dict[str, list[float]] = {"pipekit": [], "floor": []}
    for _ in range(5):
        for name, d in (("pipekit", ds), ("floor", floor)):
            start = time.process_time()
            for b in boxes:
                d[b]
            cpu[name].append((time.process_time() - start) / n)
    layers = {}
    for name, d in {"landsat8": ds.datasets[0], "cdl (reprojected)": ds.datasets[1], "landsat8 & cdl": ds}.items():
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        for b in boxes:
            d[b]
        layers[name] = (
            (time.perf_counter() - start) / n,
            (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / n,
        )
    prof = cProfile.Profile()
    prof.enable()
    for b in boxes:
        ds[b]
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).strip_dirs().sort_stats("tottime").print_stats(18)
    return {"layers": layers, "cpu": {k: sorted(v)[2] for k, v in cpu.items()}, "profile": out.getvalue()}


def profile_section(args: argparse.Namespace, root: Path) -> None:
    n = min(args.length, 300)
    print("\n== profile: where pipekit's time goes ==")
    for cachemax in [args.cachemax] + ([] if args.cached_only else [args.small_cachemax]):
        spec = {"mode": "profile", "root": str(root), "length": n, "seed": args.seed, "cachemax": cachemax}
        r = run_child(spec, timeout=args.child_timeout)
        if "error" in r:
            print(f"  GDAL_CACHEMAX {cachemax} MiB: {r['error']}")
            continue
        print(f"\n  GDAL_CACHEMAX {cachemax} MiB: per-sample time by layer ({n} boxes, warm, no DataLoader):")
        for name, (seconds, faults) in r["layers"].items():
            print(f"    {name:<20} {1e3 * seconds:.3f} ms, {faults:,.0f} minor page faults")
        c = r["cpu"]
        print(f"  CPU per warm sample, dataset[box] (median of 5 passes): pipekit {1e6 * c['pipekit']:.0f} us, "
              f"floor {1e6 * c['floor']:.0f} us: pipekit / floor = {c['pipekit'] / c['floor']:.2f}x")
        print(f"  cProfile of (landsat8 & cdl)[bbox] over the same {n} boxes, by own time:")
        lines = [
            line
            for line in r["profile"].splitlines()
            if line.strip() and not line.strip().startswith(("Ordered by", "List reduced"))
        ]
        print("\n".join("    " + line.strip() if "function calls" in line else "    " + line for line in lines))


# ------------------------------------------------------------------------------------------- index

INDEX_RES = 300.0
INDEX_PX = 16
INDEX_STEP = 5_000.0  # footprints of 4.8 km on a 5 km grid
INDEX_ORIGIN = (200_000.0, 4_900_000.0)
INDEX_COLUMNS = 100


def index_corpus(base: Path, files: int, part: int) -> Path:
    """``files`` tiny GeoTIFFs in folders of ``part`` files (written once, cached)."""
    root = base / f"bench-geo-index-{files}-{part}"
    if (root / ".complete").exists():
        return root
    print(f"  writing {files:,} GeoTIFFs of {INDEX_PX} px to {root} (once)...", flush=True)
    start = time.perf_counter()
    data = np.arange(INDEX_PX * INDEX_PX, dtype=np.uint16).reshape(1, INDEX_PX, INDEX_PX)
    for i in range(files):
        row, col = divmod(i, INDEX_COLUMNS)
        x0 = INDEX_ORIGIN[0] + col * INDEX_STEP
        y0 = INDEX_ORIGIN[1] - row * INDEX_STEP
        day = datetime(2020, 1, 1, tzinfo=timezone.utc).timestamp() + 86400 * (i % 366)
        date = datetime.fromtimestamp(day, timezone.utc).strftime("%Y%m%d")
        folder = root / f"part{i // part:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        with rasterio.open(
            folder / f"tile_{i:05d}_{date}.tif",
            "w",
            driver="GTiff",
            width=INDEX_PX,
            height=INDEX_PX,
            count=1,
            dtype="uint16",
            crs="EPSG:32615",
            transform=Affine(INDEX_RES, 0, x0, 0, -INDEX_RES, y0),
            nodata=0,
        ) as dst:
            dst.write(data)
    (root / ".complete").touch()
    print(f"  ... {time.perf_counter() - start:.1f} s", flush=True)
    return root


TILE_GLOB = "tile_*.tif"
TILE_REGEX = r"^tile_\d{5}_(?P<date>\d{8})\.tif$"


class Tiles(RasterDataset):
    """pipekit's dataset of the index corpus."""

    filename_glob = TILE_GLOB
    filename_regex = TILE_REGEX
    date_format = "%Y%m%d"


def torchgeo_tiles() -> type:
    """TorchGeo's dataset of the index corpus (a module-level class, so that it pickles)."""
    cls = globals().get("TGTiles")
    if cls is None:
        import torchgeo.datasets as tgd

        cls = type(
            "TGTiles",
            (tgd.RasterDataset,),
            {
                "__doc__": "TorchGeo's dataset of the index corpus.",
                "__module__": __name__,
                "filename_glob": TILE_GLOB,
                "filename_regex": TILE_REGEX,
                "date_format": "%Y%m%d",
            },
        )
        globals()["TGTiles"] = cls
    return cls


def index_queries(n: int, rng: np.random.Generator, rows: int) -> list[tuple[float, float, float, float]]:
    """Boxes of two footprints' size (each hits about 4 files) within the first ``rows`` rows of the grid."""
    size = 2 * INDEX_STEP
    out = []
    for _ in range(n):
        x = INDEX_ORIGIN[0] + rng.uniform(0, INDEX_COLUMNS * INDEX_STEP - size)
        y = INDEX_ORIGIN[1] - rng.uniform(size, max(size, rows * INDEX_STEP))
        out.append((x, x + size, y, y + size))
    return out


def open_each(folders: list[str]) -> float:
    """Seconds to open every GeoTIFF under ``folders`` once with rasterio and read an index's metadata."""
    start = time.perf_counter()
    for folder in folders:
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if entry.name.endswith(".tif"):
                with rasterio.open(entry.path) as src:
                    _ = (src.crs, src.transform, src.width, src.height, src.count, src.dtypes, src.nodata)
    return time.perf_counter() - start


def index_section(args: argparse.Namespace, torchgeo: bool) -> None:
    from pipekit.geo import BoundingBox

    print(
        f"\n== 3. Index build and query: RasterDataset over {', '.join(f'{s:,}' for s in args.index_sizes)} "
        "tiny GeoTIFFs =="
    )
    files = max(args.index_sizes)
    part = min(args.index_sizes)
    root = index_corpus(Path(args.cache), files, part)

    tg_tiles = None
    if torchgeo:
        import pandas as pd

        tg_tiles = torchgeo_tiles()

    rng = np.random.default_rng(args.seed)
    rows_out = []
    for size in sorted(args.index_sizes):
        paths = sorted(str(p) for p in root.iterdir() if p.is_dir())[: size // part]
        grid_rows = size // INDEX_COLUMNS
        queries = index_queries(args.index_queries, rng, grid_rows)
        start = time.perf_counter()
        ds = Tiles(paths if len(paths) > 1 else paths[0])
        build = time.perf_counter() - start
        if len(ds) != size:
            raise RuntimeError(f"pipekit indexed {len(ds)} files of {paths}, expected {size}")
        boxes = [BoundingBox(*q) for q in queries]
        ds.geo_index.query(boxes[0])  # builds the tree
        start = time.perf_counter()
        hits = [len(ds.geo_index.query(b)) for b in boxes]
        query = (time.perf_counter() - start) / len(boxes)
        row = {
            "size": size,
            "pk_build": build,
            "pk_query": query,
            "pk_hits": float(np.mean(hits)),
            "pk_pickle": len(pickle.dumps(ds)),
            "open": open_each(paths),
        }
        if tg_tiles is not None and size <= args.tg_index_cap:
            start = time.perf_counter()
            tds = tg_tiles(paths=paths if len(paths) > 1 else paths[0])
            row["tg_build"] = time.perf_counter() - start
            row["tg_pickle"] = len(pickle.dumps(tds))
            index = tds.index
            interval = pd.Interval(pd.Timestamp.min, pd.Timestamp.max)

            def tg_query(q: tuple[float, float, float, float], index: Any = index, interval: Any = interval) -> int:
                # TorchGeo 0.8's own selection in RasterDataset.__getitem__
                sel = index.iloc[index.index.overlaps(interval)]
                return len(sel.cx[q[0] : q[1], q[2] : q[3]])

            tg_query(queries[0])  # builds the spatial index
            start = time.perf_counter()
            tg_hits = [tg_query(q) for q in queries]
            row["tg_query"] = (time.perf_counter() - start) / len(queries)
            row["same_hits"] = tg_hits == hits
        rows_out.append(row)
        print(
            f"  {size:,} files: pipekit built in {build:.2f} s"
            + (f", TorchGeo in {row['tg_build']:.2f} s" if "tg_build" in row else ""),
            flush=True,
        )

    def us(x: float | None) -> str:
        return "-" if x is None else f"{1e6 * x:,.1f}"

    rows = []
    for r in rows_out:
        rows.append(
            [
                f"{r['size']:,}",
                f"{r['open']:.2f}",
                f"{r['pk_build']:.2f}",
                f"{r['tg_build']:.2f}" if "tg_build" in r else "-",
                fmt_ratio(r["tg_build"] / r["pk_build"]) if "tg_build" in r else "-",
                us(r["pk_query"]),
                us(r.get("tg_query")),
                fmt_ratio(r["tg_query"] / r["pk_query"]) if "tg_query" in r else "-",
                f"{r['pk_hits']:.1f}",
                {True: "yes", False: "NO"}.get(r.get("same_hits"), "-"),
                f"{r['pk_pickle'] / 1024:,.0f}",
                f"{r['tg_pickle'] / 1024:,.0f}" if "tg_pickle" in r else "-",
            ]
        )
    print()
    print(
        table(
            [
                "files",
                "open each s",
                "build s",
                "TorchGeo s",
                "TG/pk",
                "query us",
                "TorchGeo us",
                "TG/pk",
                "hits",
                "same hits",
                "pickle KiB",
                "TG pickle KiB",
            ],
            rows,
        )
    )
    print(
        "  open each: a plain loop opening every file once with rasterio and reading its CRS, transform, shape, "
        "dtype\n  and nodata (the metadata an index needs); build: constructing the dataset (listing, metadata, "
        "index);\n  query: one spatiotemporal query of a 10 km box; pickle: the dataset as sent to each worker."
    )
    if torchgeo and any(s > args.tg_index_cap for s in args.index_sizes):
        print(f"  (TorchGeo capped at {args.tg_index_cap:,} files: --tg-index-cap)")
    if len(rows_out) > 1:
        a, b = rows_out[0], rows_out[-1]
        growth = b["size"] / a["size"]
        print(
            f"  growth {a['size']:,} -> {b['size']:,} files ({growth:.0f}x): pipekit build "
            f"{b['pk_build'] / a['pk_build']:.1f}x, query {b['pk_query'] / a['pk_query']:.2f}x"
            + (
                f"; TorchGeo build {b['tg_build'] / a['tg_build']:.1f}x, query {b['tg_query'] / a['tg_query']:.2f}x"
                if "tg_build" in a and "tg_build" in b
                else ""
            )
        )


# ---------------------------------------------------------------------------------------------- S3


class CountingProxy:
    """A TCP forwarder on 127.0.0.1 that counts the bytes (and HTTP requests) passing each way."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.down = 0  # server -> client
        self.up = 0
        self.requests = 0
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="counting-proxy").start()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.down, self.requests

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        down = threading.Thread(target=self._pump, args=(server, client, False), daemon=True)
        down.start()
        self._pump(client, server, True)
        down.join()
        client.close()
        server.close()

    def _pump(self, src: socket.socket, dst: socket.socket, upward: bool) -> None:
        marker = b" HTTP/1.1\r\n"  # ends every request line
        tail = b""
        try:
            while True:
                data = src.recv(1 << 18)
                if not data:
                    break
                dst.sendall(data)
                with self._lock:
                    if upward:
                        self.up += len(data)
                        self.requests += (tail + data).count(marker)
                    else:
                        self.down += len(data)
                if upward:
                    tail = data[-(len(marker) - 1) :]
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()


def cog_corpus(src_root: Path, dst_root: Path, blocksize: int) -> Path:
    """The six bands of each scene and the CDL as COGs (DEFLATE, ``blocksize`` tiles, overviews), cached."""
    from rasterio.shutil import copy as rio_copy

    if (dst_root / ".complete").exists():
        return dst_root
    print(f"  converting to COGs in {dst_root} (once)...", flush=True)
    start = time.perf_counter()
    jobs = [
        (Path(p), dst_root / Path(p).relative_to(src_root), "AVERAGE")
        for scene in scene_table(src_root)
        for p in scene["paths"]
    ]
    jobs.append((src_root / "cdl" / "2023_30m_cdls.tif", dst_root / "cdl" / "2023_30m_cdls.tif", "NEAREST"))
    for src, dst, resampling in jobs:
        dst.parent.mkdir(parents=True, exist_ok=True)
        rio_copy(
            str(src),
            str(dst),
            driver="COG",
            COMPRESS="DEFLATE",
            PREDICTOR="2",
            BLOCKSIZE=str(blocksize),
            OVERVIEWS="AUTO",
            RESAMPLING=resampling,
            NUM_THREADS="ALL_CPUS",
        )
    (dst_root / ".complete").touch()
    print(f"  ... {time.perf_counter() - start:.1f} s", flush=True)
    return dst_root


def apply(t: Affine, x: float, y: float) -> tuple[float, float]:
    """``t`` applied to ``(x, y)`` (without affine's deprecated ``*`` operator)."""
    return t.a * x + t.b * y + t.c, t.d * x + t.e * y + t.f


class TileCounter:
    """Compressed sizes of the full-resolution tiles a patch touches, from the local COGs' TileByteCounts."""

    def __init__(self, cog_root: Path) -> None:
        self.scenes = scene_table(cog_root)
        self.files: dict[str, dict[str, Any]] = {}
        for path in [p for s in self.scenes for p in s["paths"]] + [str(cog_root / "cdl" / "2023_30m_cdls.tif")]:
            with rasterio.open(path) as src:
                bh, bw = src.block_shapes[0]
                nrows, ncols = math.ceil(src.height / bh), math.ceil(src.width / bw)
                sizes = np.array([[src.block_size(1, i, j) for j in range(ncols)] for i in range(nrows)], np.int64)
                self.files[path] = {
                    "crs": src.crs,
                    "transform": src.transform,
                    "block": (bh, bw),
                    "sizes": sizes,
                    "shape": (src.height, src.width),
                }
        self.cdl = str(cog_root / "cdl" / "2023_30m_cdls.tif")
        self.seen: set[tuple[str, int, int]] = set()

    def _tiles(self, path: str, col0: float, row0: float, col1: float, row1: float) -> list[tuple[str, int, int]]:
        f = self.files[path]
        bh, bw = f["block"]
        h, w = f["shape"]
        c0, r0 = max(0, math.floor(col0)), max(0, math.floor(row0))
        c1, r1 = min(w, math.ceil(col1)), min(h, math.ceil(row1))
        return [(path, i, j) for i in range(r0 // bh, (r1 - 1) // bh + 1) for j in range(c0 // bw, (c1 - 1) // bw + 1)]

    def patch(self, bbox: Any, crs: Any) -> tuple[int, int]:
        """``(bytes of the tiles the patch touches, bytes of those no earlier patch touched)``."""
        tiles = []
        for scene in self.scenes:
            if scene["mint"] <= bbox.mint_s <= scene["maxt"]:
                for path in scene["paths"]:
                    inv = ~self.files[path]["transform"]
                    c0, r0 = apply(inv, bbox.minx, bbox.maxy)
                    c1, r1 = apply(inv, bbox.maxx, bbox.miny)
                    tiles += self._tiles(path, c0, r0, c1, r1)
                break
        f = self.files[self.cdl]
        left, bottom, right, top = transform_bounds(
            crs, f["crs"], bbox.minx, bbox.miny, bbox.maxx, bbox.maxy, densify_pts=21
        )
        inv = ~f["transform"]
        c0, r0 = apply(inv, left, top)
        c1, r1 = apply(inv, right, bottom)
        tiles += self._tiles(self.cdl, c0, r0, c1, r1)
        total = sum(int(self.files[p]["sizes"][i, j]) for p, i, j in tiles)
        new = sum(int(self.files[p]["sizes"][i, j]) for p, i, j in tiles if (p, i, j) not in self.seen)
        self.seen.update(tiles)
        return total, new


def child_s3(spec: dict[str, Any]) -> dict[str, Any]:
    """One S3/local-COG variant: build, two passes; bytes through a counting proxy in this process."""
    from pipekit import _fast
    from pipekit.geo import RandomGeoSampler, stack_samples
    from pipekit.geo._bbox import from_slices

    variant = spec["variant"]
    if spec.get("cpus"):  # --s3-pin: before any thread or worker starts, so that all of them inherit it
        os.sched_setaffinity(0, spec["cpus"])
    caches_off = variant.endswith("-nocache")
    configure_gdal(spec["small_cachemax"] if caches_off else spec["cachemax"])
    if variant.endswith("-serial"):  # pipekit before issue 12: a sample's band files read one after another
        _fast.set_enabled("concurrent_parts", False)
    if variant.endswith(("-serial", "-envs", "-before")):  # before issue 12's S3 work:
        _fast.set_enabled("lane_env", False)  # the GDAL environment entered and left around every open and read
    cog_root = Path(spec["cog_root"])
    proxy = None
    if variant.startswith("local"):
        ds_root: str | Path = cog_root
        build_args: dict[str, Any] = {}
    else:
        # the counting proxy copies every byte through Python threads of this process: --s3-direct leaves it out
        proxy = None if spec.get("direct") else CountingProxy(("127.0.0.1", spec["s3_port"]))
        endpoint = f"http://127.0.0.1:{spec['s3_port']}" if proxy is None else proxy.endpoint_url
        options = {
            "key": spec["key"],
            "secret": spec["secret"],
            "client_kwargs": {"endpoint_url": endpoint, "region_name": spec["region"]},
        }
        ds_root = f"s3://{spec['bucket']}"
        build_args = {
            "storage_options": options,
            "vsi": None if variant.startswith("vsi") else False,
            "gdal_options": dict(spec["gdal_options"]) if variant.endswith("-gdal") else {},
        }
        if variant.startswith("cached"):
            # the round's cache folder: empty for "cached" (pass 1 is a first pass for it too); "cached-warm"
            # runs after it in a new process, as a later run (or epoch in fresh workers) would
            build_args["cache_dir"] = spec["cache_dir"]
            if variant == "cached":
                shutil.rmtree(spec["cache_dir"], ignore_errors=True)
        if variant.endswith("-before"):  # pipekit's per-file VSI cache before issue 12's S3 work
            build_args["gdal_options"].update({"VSI_CACHE": "TRUE", "VSI_CACHE_SIZE": 8 * MIB})
        if caches_off:  # no per-file VSI cache, no /vsicurl/ region cache (the GDAL block cache is small)
            build_args["gdal_options"].update(
                {"VSI_CACHE": "FALSE", "CPL_VSIL_CURL_NON_CACHED": f"/vsis3/{spec['bucket']}/"}
            )
    counter = TileCounter(cog_root)
    start = time.perf_counter()
    ds = pipekit_dataset(ds_root, **build_args)
    result: dict[str, Any] = {"build": time.perf_counter() - start, "variant": variant}
    if proxy is not None:
        result["build_bytes"], result["build_requests"] = proxy.snapshot()
    sampler = RandomGeoSampler(ds, size=PATCH, length=spec["length"], seed=spec["seed"])
    workers = spec.get("workers", 0)
    loader = DataLoader(
        ds,
        batch_size=spec["batch_size"],
        sampler=sampler,
        collate_fn=stack_samples,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    for name in ("pass1", "pass2"):
        before = proxy.snapshot() if proxy is not None else (0, 0)
        n = 0
        bounds: list[Any] = []
        start = time.perf_counter()
        it = iter(loader)
        pids = [os.getpid()] + [w.pid for w in getattr(it, "_workers", [])]
        cpu = cpu_seconds(pids), cpu_seconds([spec["server_pid"]])
        for batch in it:
            n += batch["image"].shape[0]
            bounds.extend(batch["bounds"])
        elapsed = time.perf_counter() - start
        cpu = cpu_seconds(pids) - cpu[0], cpu_seconds([spec["server_pid"]]) - cpu[1]
        after = proxy.snapshot() if proxy is not None else (0, 0)
        touched = new = 0
        for b in bounds:
            t, w = counter.patch(from_slices(b), ds.crs)
            touched += t
            new += w
        result[name] = {
            "samples": n,
            "rate": n / elapsed,
            "bytes": after[0] - before[0],
            "cpu_ms": 1e3 * cpu[0] / n,
            "server_cpu_ms": 1e3 * cpu[1] / n,
            "requests": after[1] - before[1],
            "touched": touched,
            "new": new,
            "digest": boxes_digest(bounds),
        }
    if proxy is not None:
        proxy.close()
    return result


S3_LABELS = {
    "local": "local COGs",
    "vsi": "S3, GDAL /vsis3/",
    "vsi-envs": "S3, /vsis3/, GDAL env entered per read",
    "vsi-before": "S3, /vsis3/, env per read + VSI_CACHE 8 MiB",
    "vsi-serial": "S3, /vsis3/, band files one by one",
    "vsi-gdal": "S3, /vsis3/ with --s3-gdal options",
    "fsspec": "S3, fsspec (vsi=False)",
    "cached": "S3, shared range cache (cache_dir)",
    "cached-warm": "S3, range cache filled by the run before",
    "local-nocache": "local COGs, small cache",
    "vsi-nocache": "S3, /vsis3/, caches off",
    "fsspec-nocache": "S3, fsspec, caches off",
}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def parse_cpus(text: str) -> list[int]:
    """``"0,2-3"`` -> ``[0, 2, 3]``; ``SystemExit`` naming ``--s3-pin`` for a list this process cannot run on."""
    cpus: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            cpus.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise SystemExit(f"--s3-pin: {text!r} is not a CPU list such as 0 or 0,2-3") from None
    allowed = os.sched_getaffinity(0)
    if not cpus or not set(cpus) <= allowed:
        raise SystemExit(f"--s3-pin: CPUs {text!r} are not among this machine's usable CPUs {sorted(allowed)}")
    return cpus


def pin_process(pid: int, cpus: list[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (threads it starts later inherit the mask of the one starting them)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task), cpus)


def s3_section(args: argparse.Namespace, root: Path) -> None:
    variants = [v for v in S3_LABELS if v in args.s3_variants]
    pins = reader_cpus = None
    if args.s3_pin:  # checked before anything starts
        server_text, colon, reader_text = args.s3_pin.partition(":")
        if not colon:
            raise SystemExit(f"--s3-pin: {args.s3_pin!r} should be SERVER:READERS CPU lists, e.g. 1:0")
        pins = parse_cpus(server_text), parse_cpus(reader_text)
    gdal_options = dict(item.split("=", 1) for item in args.s3_gdal)
    print(
        f"\n== 4. From S3: COGs ({args.cog_blocksize} px tiles) on a local SeaweedFS server vs local disk, "
        f"{args.s3_length} samples per pass, {args.s3_workers} workers, {args.s3_repeat} round(s) of "
        f"{', '.join(variants)}{f'; vsi-gdal: gdal_options {gdal_options}' if gdal_options else ''} =="
    )
    cog_root = cog_corpus(root, Path(f"{root}-cog{args.cog_blocksize}"), args.cog_blocksize)
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from s3server import start_s3_server
    except ImportError as exc:
        print(f"  skipped: cannot import tests/s3server.py ({exc})")
        return
    try:
        server = start_s3_server(timeout=60.0, extra_args=args.s3_server_args.split())
    except Exception as exc:  # WeedNotFoundError, or it did not come up
        print(f"  skipped: the S3 server did not start: {exc}")
        return
    rounds: list[dict[str, dict[str, Any]]] = []
    cache_root = Path(tempfile.mkdtemp(prefix="pipekit-bench-rangecache-"))
    try:
        bucket = server.create_bucket("bench-geo")
        fs = server.fs()
        start = time.perf_counter()
        for path in sorted(p for p in cog_root.rglob("*") if p.is_file() and p.suffix.lower() in (".tif", ".tiff")):
            fs.put_file(str(path), f"{bucket}/{path.relative_to(cog_root).as_posix()}")
        total = sum(p.stat().st_size for p in cog_root.rglob("*.*") if p.is_file())
        print(f"  uploaded {total / MIB:.0f} MiB in {time.perf_counter() - start:.1f} s to s3://{bucket}/", flush=True)
        if pins is not None:
            server_cpus, reader_cpus = pins
            pin_process(server.process.pid, server_cpus)
            print(f"  --s3-pin: the S3 server on CPUs {server_text}, each reader and its workers on CPUs {reader_text}")
        port = int(server.endpoint_url.rsplit(":", 1)[1])
        for _ in range(args.s3_repeat):  # the variants side by side, round after round: load shifts hit them all
            results = {}
            cache_dir = str(cache_root / f"round-{len(rounds)}")  # the range cache variants' folder
            for variant in variants:
                spec = {
                    "mode": "s3",
                    "variant": variant,
                    "cog_root": str(cog_root),
                    "s3_port": port,
                    "key": server.key,
                    "secret": server.secret,
                    "region": server.region,
                    "bucket": bucket,
                    "length": args.s3_length,
                    "batch_size": args.batch_size,
                    "seed": args.seed,
                    "cachemax": None,
                    "small_cachemax": args.small_cachemax,
                    "workers": args.s3_workers,
                    "gdal_options": gdal_options,
                    "server_pid": server.process.pid,
                    "direct": args.s3_direct,
                    "cache_dir": cache_dir,
                    "cpus": reader_cpus,
                }
                results[variant] = run_child(spec, timeout=args.child_timeout)
                if "error" in results[variant]:
                    print(f"  {S3_LABELS[variant]}: {results[variant]['error']}")
            rounds.append(results)
            load = " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
            rates = ", ".join(
                f"{v} {r['pass1']['rate']:.0f}/{r['pass2']['rate']:.0f} "
                f"({r['pass1']['cpu_ms']:.1f}+{r['pass1']['server_cpu_ms']:.1f} ms)"
                for v, r in results.items()
                if "error" not in r
            )
            print(
                f"  round {len(rounds)}: {rates} samples/s pass 1/2 (pass 1 CPU per sample: reader + S3 server); "
                f"load average {load}",
                flush=True,
            )
    finally:
        server.stop(timeout=3.0)
        shutil.rmtree(cache_root, ignore_errors=True)

    results = rounds[0]
    rows = []
    for variant, r in results.items():
        if "error" in r:
            continue
        for name in ("pass1", "pass2"):
            p = r[name]
            n = p["samples"]
            remote = not variant.startswith("local") and not args.s3_direct
            rate = _median([rd[variant][name]["rate"] for rd in rounds if "error" not in rd.get(variant, {"error": 1})])
            rows.append(
                [
                    f"{S3_LABELS[variant]}, pass {name[-1]}",
                    fmt_rate(rate),
                    f"{p['bytes'] / n / MIB:.2f}" if remote else "-",
                    f"{p['requests'] / n:.1f}" if remote else "-",
                    f"{p['touched'] / n / MIB:.2f}",
                    fmt_ratio(p["bytes"] / p["touched"]) if remote else "-",
                    f"{p['new'] / n / MIB:.2f}",
                    fmt_ratio(p["bytes"] / p["new"])
                    if remote and p["new"] and not variant.endswith("-nocache")
                    else "-",
                ]
            )
    print()
    print(table(["", "samples/s", "MiB/patch", "GET/patch", "touched MiB", "/touched", "new MiB", "/new"], rows))
    print(
        "  samples/s: the median of the rounds; bytes and requests: of the first round.\n"
        "  MiB/patch: bytes received from the server per patch (HTTP headers included); touched MiB: compressed "
        "size of\n  the full-resolution tiles each patch touches (6 band files + the CDL); new MiB: of those, "
        "tiles no earlier\n  patch of the run touched. Pass 1 includes opening the files (headers) in the reading "
        f"threads.\n  pipekit's defaults: GDAL_CACHEMAX {pipekit_cachemax()} MiB, no per-file VSI_CACHE; "
        f"small cache / caches off: GDAL_CACHEMAX {args.small_cachemax} MiB,\n  and for S3 VSI_CACHE=FALSE and "
        "CPL_VSIL_CURL_NON_CACHED (gdal_options=), so every patch fetches its tiles again."
    )
    for variant, r in results.items():
        if "error" not in r and not variant.startswith("local") and not args.s3_direct:
            print(
                f"  {S3_LABELS[variant]}: dataset built (listing + headers) in {r['build']:.2f} s, "
                f"{r['build_bytes'] / 1024:,.0f} KiB in {r['build_requests']} requests"
            )
    for variant in (
        "vsi",
        "vsi-envs",
        "vsi-before",
        "vsi-serial",
        "vsi-gdal",
        "fsspec",
        "cached",
        "cached-warm",
        "vsi-nocache",
        "fsspec-nocache",
    ):
        if variant not in results or "error" in results[variant]:
            continue
        r = results[variant]
        base = "local-nocache" if variant.endswith("-nocache") else "local"
        speed = ""
        ratios = {
            name: [
                rd[variant][name]["rate"] / rd[base][name]["rate"]
                for rd in rounds
                if "error" not in rd.get(variant, {"error": 1}) and "error" not in rd.get(base, {"error": 1})
            ]
            for name in ("pass1", "pass2")
        }
        if ratios["pass1"]:
            each = "" if len(rounds) == 1 else f" [rounds: {', '.join(f'{x:.2f}' for x in ratios['pass1'])}]"
            speed = (
                f"samples/s {fmt_ratio(_median(ratios['pass1']))} (pass 1{each}), "
                f"{fmt_ratio(_median(ratios['pass2']))} (pass 2) of {S3_LABELS[base]}; "
            )
        cpu = [
            (rd[variant]["pass1"]["cpu_ms"], rd[base]["pass1"]["cpu_ms"])
            for rd in rounds
            if "error" not in rd.get(variant, {"error": 1}) and "error" not in rd.get(base, {"error": 1})
        ]
        if cpu:  # the reader's CPU a patch against local disk's: the ratio where the server has cores of its own
            mine, theirs = _median([c for c, _ in cpu]), _median([c for _, c in cpu])
            x = _median([c / b for c, b in cpu])
            speed += (
                f"reader CPU a patch {mine:.1f} ms against {theirs:.1f} ms, {fmt_ratio(x)} (pass 1, median of rounds; "
                f"target <= 1.25x: {verdict(x <= 1.25)}); "
            )
        if args.s3_direct:
            data = "bytes not counted (--s3-direct)"
        elif variant.endswith("-nocache"):
            p = r["pass2"]
            x = p["bytes"] / p["touched"]
            data = f"bytes per patch {fmt_ratio(x)} the tiles it touches (pass 2; target <= 2x: {verdict(x <= 2)})"
        else:
            p = r["pass1"]
            x = p["bytes"] / p["new"]
            data = (
                f"bytes {fmt_ratio(x)} the tiles first touched (pass 1, headers included; "
                f"target <= 2x: {verdict(x <= 2)})"
            )
        print(f"  {S3_LABELS[variant]}: {speed}{data}")
    digests = {r["pass2"]["digest"] for rd in rounds for r in rd.values() if "error" not in r}
    print(f"  all variants read the same boxes: {'yes' if len(digests) == 1 else 'NO'}")


# -------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from pipekit.synthetic import default_cache_dir

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny corpus, few samples: a smoke run")
    p.add_argument("--size", type=int, default=3000, help="Landsat scene side in pixels (default 3000)")
    p.add_argument("--scenes", type=int, default=2, help="Landsat scenes (default 2)")
    p.add_argument("--length", type=int, default=800, help="samples per pass, cached regime (default 800)")
    p.add_argument("--uncached-length", type=int, default=240, help="samples per pass, uncached regime (default 240)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="DataLoader workers (default 0 2)")
    p.add_argument(
        "--cachemax",
        type=int,
        default=512,
        help="GDAL_CACHEMAX in MiB, cached regime (default 512: holds every contender's working set)",
    )
    p.add_argument("--small-cachemax", type=int, default=8, help="GDAL_CACHEMAX in MiB, uncached regime (default 8)")
    p.add_argument("--cached-only", action="store_true", help="skip the uncached regime")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--index-sizes",
        type=int,
        nargs="+",
        default=[1000, 10000],
        help="file counts for the index build (default 1000 10000; the smallest divides the others)",
    )
    p.add_argument("--index-queries", type=int, default=2000)
    p.add_argument("--tg-index-cap", type=int, default=10000, help="largest file count TorchGeo indexes")
    p.add_argument("--s3-length", type=int, default=160, help="samples per pass from S3 (default 160)")
    p.add_argument("--cog-blocksize", type=int, default=512)
    p.add_argument(
        "--s3-variants",
        nargs="+",
        choices=list(S3_LABELS),
        default=[v for v in S3_LABELS if v not in ("vsi-gdal", "vsi-envs", "vsi-before")],
        help="S3 section variants (default all); e.g. local vsi for the first-pass ratio",
    )
    p.add_argument("--s3-repeat", type=int, default=1, help="rounds of the S3 variants, side by side (default 1)")
    p.add_argument("--s3-workers", type=int, default=0, help="DataLoader workers in the S3 section (default 0)")
    p.add_argument(
        "--s3-pin",
        metavar="SERVER:READERS",
        help="CPU lists, e.g. 1:0: the S3 server on CPU 1, every variant's reader (and its workers) on CPU 0, so "
        "the server's CPU does not share the readers' cores (as a remote server would not); local disk's reader "
        "gets the same CPUs",
    )
    p.add_argument(
        "--s3-direct",
        action="store_true",
        help="S3 variants connect to the server directly, without the byte-counting proxy (no byte counts)",
    )
    p.add_argument(
        "--s3-gdal",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="gdal_options of the vsi-gdal variant (e.g. VSI_CACHE=FALSE)",
    )
    p.add_argument(
        "--s3-server-args",
        default="",
        help="extra arguments of the SeaweedFS server, one string (e.g. --s3-server-args='-s3.cacheCapacityMB=256')",
    )
    p.add_argument(
        "--pool-off-row",
        action="store_true",
        help="with workers, also run pipekit with its reuse of shared-memory batch buffers off "
        "(PIPEKIT_SHM_POOL=0: fresh shared memory per batch, as before pipekit._shm)",
    )
    p.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch.set_num_threads in each sampling run's main process (default: torch's own)",
    )
    p.add_argument("--skip-torchgeo", action="store_true")
    p.add_argument("--skip-s3", action="store_true")
    p.add_argument("--skip-index", action="store_true")
    p.add_argument("--skip-sampling", action="store_true")
    p.add_argument("--profile", action="store_true", help="cProfile pipekit's reads (both cache regimes)")
    p.add_argument("--child-timeout", type=float, default=400.0)
    p.add_argument("--cache", default=str(default_cache_dir()), help="corpus cache folder")
    p.add_argument("--_child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.size, args.length, args.uncached_length, args.s3_length = 768, 48, 24, 24
        args.index_sizes = [500, 2000]
        args.index_queries = 200
        args.cached_only = True
    if min(args.index_sizes) < 1 or any(s % min(args.index_sizes) for s in args.index_sizes):
        p.error("--index-sizes: the smallest must divide the others")
    if any(s % INDEX_COLUMNS for s in args.index_sizes):
        p.error(f"--index-sizes must be multiples of {INDEX_COLUMNS}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args._child:
        spec = json.loads(args._child)
        result = {"sampling": child_sampling, "s3": child_s3, "profile": child_profile}[spec["mode"]](spec)
        print(RESULT + json.dumps(result), flush=True)
        return

    from pipekit.synthetic.geo import write_landsat_cdl_corpus

    torchgeo = have_torchgeo() and not args.skip_torchgeo
    versions = [f"torch {torch.__version__}", f"rasterio {rasterio.__version__}", f"GDAL {rasterio.__gdal_version__}"]
    if have_torchgeo():
        import torchgeo as tg

        versions.append(f"torchgeo {tg.__version__}")
    load = " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    print(
        f"geo_sampling: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {load}; {', '.join(versions)}"
    )
    if not have_torchgeo():
        print(
            "TorchGeo is not installed (it comes with the 'bench' extra: ./run bench geo_sampling): its rows "
            "are skipped"
        )
    elif args.skip_torchgeo:
        print("--skip-torchgeo: TorchGeo's rows are skipped")

    start_all = time.perf_counter()
    print(
        f"\n== 1. Corpus: {args.scenes} Landsat 8 scenes of {args.size} px (UTM 15N, 256 px DEFLATE tiles) + CDL "
        "(EPSG:5070) =="
    )
    root = write_landsat_cdl_corpus(
        Path(args.cache) / f"bench-geo-landsat-cdl-{args.size}x{args.scenes}",
        size=args.size,
        scenes=args.scenes,
        progress=False,
    )
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    working = (args.size**2 * 2 * len(BANDS) * args.scenes) / MIB
    print(f"  {root} ({size / MIB:.0f} MiB on disk; the six bands read are {working:.0f} MiB decoded)")

    if not args.skip_sampling:
        sampling_section(args, root, torchgeo)
        agreement_check(root, 16 if args.quick else 32, args.seed)
    if args.profile:
        profile_section(args, root)
    if not args.skip_index:
        index_section(args, torchgeo)
    if not args.skip_s3:
        s3_section(args, root)
    print(f"\ntotal {time.perf_counter() - start_all:.0f} s")


if __name__ == "__main__":
    main()
