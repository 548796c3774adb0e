"""The cost of handing a remote read to pipekit's GDAL I/O threads, against futures on thread pools.

A remote raster sample (``landsat8 & cdl`` from S3) hands its band files to
the I/O threads with ``pipekit.geo.io.run_parts`` (six parts, one per band
file, all at once) and its single-file operand with ``run_remote`` (one
part).  With the tiles in GDAL's block cache (every epoch after the first on
a dataset that fits it) a band read itself costs ~30 µs, so the hand-off is
a visible share of a sample.  This prints the CPU and wall time per call of
both, with parts that do nothing, side by side with the design they replace
and what one writes by hand: one single-thread ``ThreadPoolExecutor`` per
lane, a future per part, ``concurrent.futures.wait``.

Run: ``./run bench io_lanes`` (``--help`` for options).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import platform
import statistics
import time
from collections.abc import Callable

from pipekit.geo import io as geo_io


class FuturesLanes:
    """The hand-written alternative: a single-thread executor per lane, a future per part."""

    def __init__(self, count: int) -> None:
        self.executors = [concurrent.futures.ThreadPoolExecutor(1) for _ in range(count)]

    def run_parts(self, fn: Callable[[int], object], count: int) -> list[object]:
        futures = [self.executors[k % len(self.executors)].submit(fn, k) for k in range(count)]
        concurrent.futures.wait(futures)
        return [f.result() for f in futures]

    def run_remote(self, fn: Callable[[], object]) -> object:
        return self.executors[0].submit(fn).result()

    def close(self) -> None:
        for executor in self.executors:
            executor.shutdown()


def per_call(call: Callable[[], object], calls: int, repeats: int) -> tuple[float, float]:
    """Median µs of wall and of process CPU time per call, over ``repeats`` runs of ``calls`` calls."""
    call()
    walls, cpus = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        for _ in range(calls):
            call()
        walls.append((time.perf_counter() - t) / calls * 1e6)
        cpus.append((time.process_time() - c) / calls * 1e6)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", type=int, default=6, help="parts per run_parts call (a Landsat scene's bands)")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=5, help="runs per row, alternated (median)")
    args = parser.parse_args()

    lanes = geo_io.REMOTE_IO_THREADS
    futures = FuturesLanes(lanes)
    noop = lambda k: k  # noqa: E731 - the parts do nothing: what is left is the hand-off
    rows = {
        f"run_parts, {args.parts} parts": (
            lambda: geo_io.run_parts(noop, args.parts),
            lambda: futures.run_parts(noop, args.parts),
        ),
        "run_remote, 1 part": (lambda: geo_io.run_remote(int), lambda: futures.run_remote(int)),
    }
    print(f"# io_lanes: {lanes} I/O threads, {args.calls} calls x {args.repeats} runs, parts that do nothing")
    print(f"# machine: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    print(f"{'':24} | {'pipekit wall':>12} | {'CPU':>7} | {'futures wall':>12} | {'CPU':>7} | futures/pipekit CPU")
    try:
        for name, (ours, theirs) in rows.items():
            a, b = [], []
            for _ in range(args.repeats):  # alternated: drift in the machine's load hits both
                a.append(per_call(ours, args.calls, 1))
                b.append(per_call(theirs, args.calls, 1))
            ow, oc = (statistics.median(x[i] for x in a) for i in (0, 1))
            tw, tc = (statistics.median(x[i] for x in b) for i in (0, 1))
            print(f"{name:24} | {ow:9.0f} us | {oc:4.0f} us | {tw:9.0f} us | {tc:4.0f} us | {tc / oc:.2f}x")
    finally:
        futures.close()


if __name__ == "__main__":
    main()
