"""Vector labels: random 256 px patches of ``landsat8 & fields`` -- pipekit's VectorDataset vs TorchGeo 0.8's.

What is measured (issue 10, vector labels):

1. **Corpus**: one synthetic Landsat 8 Collection 2 scene
   (:func:`pipekit.synthetic.geo.write_landsat_cdl_corpus`, 1024 px at 30 m in
   UTM 15N, six reflective bands read) and a GeoPackage of ~3,000 field
   polygons over it (a jittered grid of quadrilaterals, some with a hole, crop
   labels 1-5), stored in EPSG:4326 as field boundaries often are, so both
   libraries reproject them onto the Landsat grid.  Cached under
   ``pipekit.synthetic.default_cache_dir()``.
2. **Sampling**: random 256 px patches of ``Landsat8(bands=all_bands[1:-2]) &
   VectorDataset(fields.gpkg, label_name="crop")`` through a
   ``torch.utils.data.DataLoader`` (``sampler=``, ``collate_fn=stack_samples``,
   batch size 8) with 0 and 2 workers, for pipekit and TorchGeo 0.8 (its own
   ``Landsat8``, ``VectorDataset``, ``RandomGeoSampler``, ``stack_samples`` on the
   same files).  Each (library, workers) runs in a fresh Python process with
   persistent workers: a warm-up pass, then a measured pass over fresh boxes of the same count;
   samples/s and CPU time per sample (of the process and its workers) are
   reported, and the ratio pipekit/TorchGeo (target >= 3x).
3. **Checks**: the masks of both libraries on the same boxes (pixel agreement),
   and the pickled size of pipekit's ``VectorDataset`` (what each worker receives).

Run: ``PYTHONPATH=src python benchmarks/geo_vector.py`` (``--quick`` for a
smoke run; ``--length`` patches per pass).  Without TorchGeo its rows are
skipped.  Timings on a shared machine are noisy: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import pickle
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

BANDS = ("SR_B2", "SR_B3", "SR_B4", "SR_B5", "SR_B6", "SR_B7")
PATCH = 256
RESULT = "@@RESULT@@ "


def corpus(fields: int = 3000, seed: int = 0) -> Path:
    """The Landsat scene and ``fields.gpkg`` (written once into the cache)."""
    import geopandas
    import rasterio
    import shapely

    from pipekit.synthetic import default_cache_dir
    from pipekit.synthetic.geo import write_landsat_cdl_corpus

    root = write_landsat_cdl_corpus(Path(default_cache_dir()) / "geo_vector", size=1024, scenes=1, progress=False)
    gpkg = root / "fields" / f"fields_{fields}.gpkg"
    if gpkg.exists():
        return root
    band = next((root / "landsat8").rglob("*_SR_B2.TIF"))
    with rasterio.open(band) as src:
        left, bottom, right, top = src.bounds
        crs = src.crs
    rng = np.random.default_rng(seed)
    side = int(np.ceil(np.sqrt(fields)))
    cw, ch = (right - left) / side, (top - bottom) / side
    geoms, crops = [], []
    for k in range(fields):
        i, j = divmod(k, side)
        x0, y0 = left + j * cw, bottom + i * ch
        m = 0.1 + 0.1 * rng.random(8)  # margins: fields do not touch
        quad = shapely.Polygon([(x0 + m[0] * cw, y0 + m[1] * ch), (x0 + (1 - m[2]) * cw, y0 + m[3] * ch),
                                (x0 + (1 - m[4]) * cw, y0 + (1 - m[5]) * ch), (x0 + m[6] * cw, y0 + (1 - m[7]) * ch)])
        if rng.random() < 0.1:  # a farmstead in the field
            c = quad.centroid
            quad = quad.difference(shapely.box(c.x - 0.1 * cw, c.y - 0.1 * ch, c.x + 0.1 * cw, c.y + 0.1 * ch))
        geoms.append(shapely.segmentize(quad, cw / 8))  # boundaries with some vertices, as digitised ones have
        crops.append(int(rng.integers(1, 6)))
    gdf = geopandas.GeoDataFrame({"crop": crops}, geometry=geoms, crs=crs.to_wkt()).to_crs("EPSG:4326")
    gpkg.parent.mkdir(parents=True, exist_ok=True)
    tmp = gpkg.with_suffix(".tmp.gpkg")
    gdf.to_file(tmp, driver="GPKG", layer="fields", engine="pyogrio")
    os.replace(tmp, gpkg)
    return root


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


def build(kind: str, root: Path, gpkg: Path) -> Any:
    if kind == "pipekit":
        from pipekit import datasets

        landsat = datasets.Landsat8(root=root / "landsat8", bands=list(BANDS))
        return landsat & datasets.VectorDataset(gpkg, label_name="crop")
    import torchgeo.datasets as tgd

    with contextlib.redirect_stdout(io.StringIO()):
        landsat = tgd.Landsat8(paths=str(root / "landsat8"), bands=list(BANDS))
        return landsat & tgd.VectorDataset(paths=str(gpkg), label_name="crop")


def child(spec: dict[str, Any]) -> dict[str, Any]:
    root, gpkg, kind = Path(spec["root"]), Path(spec["gpkg"]), spec["kind"]
    n, workers, seed = spec["length"], spec["workers"], spec["seed"]
    t0 = time.perf_counter()
    data = build(kind, root, gpkg)
    built = time.perf_counter() - t0
    out: dict[str, Any] = {"build": built}
    if kind == "pipekit":
        from pipekit.geo import RandomGeoSampler, stack_samples

        sampler = RandomGeoSampler(data, size=PATCH, length=n, seed=seed)
        collate = stack_samples
    else:
        import torchgeo.datasets as tgd
        from torchgeo.samplers import RandomGeoSampler as TGRandomGeoSampler

        sampler = TGRandomGeoSampler(data, size=PATCH, length=n, generator=torch.Generator().manual_seed(seed))
        collate = tgd.stack_samples
    # persistent workers: the second pass (fresh boxes: each epoch draws its own) is measured with warm
    # workers, and their CPU time is read while they are alive
    loader = DataLoader(data, batch_size=8, sampler=sampler, collate_fn=collate, num_workers=workers,
                        persistent_workers=workers > 0)
    for name in ("pass1", "pass2"):
        start = time.perf_counter()
        it = iter(loader)
        pids = [os.getpid()] + [w.pid for w in getattr(it, "_workers", [])]
        cpu = cpu_seconds(pids)
        count, burned = 0, 0
        for batch in it:
            count += batch["image"].shape[0]
            burned += int((batch["mask"] > 0).sum())
        cpu = cpu_seconds(pids) - cpu
        elapsed = time.perf_counter() - start
        out[name] = {"samples": count, "seconds": elapsed, "rate": count / elapsed, "cpu_ms": 1e3 * cpu / count,
                     "labelled": burned / (count * PATCH * PATCH)}
    return out


def run_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])
    return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]}


def agreement(root: Path, gpkg: Path, n: int) -> tuple[float, int]:
    """Pixel agreement of both libraries' masks over ``n`` identical boxes, and pipekit's pickled dataset size."""
    from pipekit import datasets
    from pipekit.geo import RandomGeoSampler

    ours = datasets.VectorDataset(gpkg, label_name="crop")
    size = len(pickle.dumps(ours))
    if importlib.util.find_spec("torchgeo") is None:
        return float("nan"), size
    import torchgeo.datasets as tgd

    landsat = datasets.Landsat8(root=root / "landsat8", bands=list(BANDS))
    ours = ours.to_crs(landsat.crs, res=landsat.res)
    with contextlib.redirect_stdout(io.StringIO()):  # TorchGeo prints its CRS conversions
        theirs = tgd.VectorDataset(paths=str(gpkg), label_name="crop")
        theirs.crs, theirs.res = ours.crs, ours.res
    equal = total = 0
    for q in RandomGeoSampler(landsat & ours, size=PATCH, length=n, seed=7):
        a, b = ours[q]["mask"], theirs[q]["mask"]
        equal += int((a == b).sum())
        total += a.numel()
    return equal / total, size


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, default=64, help="patches per pass")
    p.add_argument("--fields", type=int, default=3000)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--quick", action="store_true", help="16 patches, 0 workers")
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args(argv)
    if args.child:
        print(RESULT + json.dumps(child(json.loads(args.child))), flush=True)
        return
    if args.quick:
        args.length, args.workers = 16, [0]
    root = corpus(args.fields)
    gpkg = root / "fields" / f"fields_{args.fields}.gpkg"
    torchgeo = importlib.util.find_spec("torchgeo") is not None
    print(f"geo_vector: {args.length} random {PATCH} px patches of landsat8 (6 bands) & {args.fields} field "
          f"polygons (GeoPackage, EPSG:4326); batch 8; machine: {platform.machine()}, {os.cpu_count()} CPUs "
          f"(shared, loaded), torch {torch.__version__}")
    kinds = ["pipekit"] + (["torchgeo"] if torchgeo else [])
    rows = []
    for workers in args.workers:
        rates = {}
        for kind in kinds:
            spec = {"root": str(root), "gpkg": str(gpkg), "kind": kind, "length": args.length,
                    "workers": workers, "seed": 0}
            res = run_child(spec, args.timeout)
            if "error" in res:
                print(f"  {kind:8s} workers={workers}: ERROR {res['error']}")
                continue
            m = res["pass2"]
            rates[kind] = m
            print(f"  {kind:8s} workers={workers}: {m['rate']:7.1f} patches/s, {m['cpu_ms']:7.1f} ms CPU/patch, "
                  f"build {res['build']:.2f} s, labelled pixels {m['labelled']:.2f}")
        if len(rates) == 2:
            ratio = rates["pipekit"]["rate"] / rates["torchgeo"]["rate"]
            cpu = rates["torchgeo"]["cpu_ms"] / rates["pipekit"]["cpu_ms"]
            rows.append((workers, ratio, cpu))
            print(f"  ratio pipekit/TorchGeo, workers={workers}: {ratio:.1f}x patches/s, {cpu:.1f}x less CPU "
                  f"({'meets' if ratio >= 3 else 'misses'} the 3x target)")
    match, size = agreement(root, gpkg, 8)
    print(f"  masks: pipekit and TorchGeo agree on {100 * match:.3f}% of pixels (8 patches); "
          f"pickled pipekit VectorDataset: {size} bytes")


if __name__ == "__main__":
    main()
