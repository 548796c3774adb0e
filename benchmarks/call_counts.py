"""Python function calls per item of pipekit chains: a deterministic measure of per-item overhead.

Wall-clock benchmarks on a shared 2-core machine move by 10-20% with the load; the number of Python
function calls a chain makes per item does not (``cProfile`` counts them exactly), so two versions of
pipekit can be compared on it whatever else the machine is doing.  Two chains, each run for one epoch
through ``pipekit.DataLoader(num_workers=0)`` after a warm-up epoch:

* ``pipes``: ``IterableWrapper -> shuffle(1000) -> sharding_filter -> map -> batch(32)`` over ints
  (the plumbing alone: every call is pipekit's or torch's DataPipe machinery);
* ``files``: ``list_files_by_fsspec(folder, recursive) -> shuffle -> sharding_filter ->
  open_files_by_fsspec(rb) -> map(read and close) -> batch(32)`` over small local files (the listing and
  opening of ``pipes_overhead``, without the decoding);
* ``geo``: ``RandomGeoSampler(128 px).as_pipe() -> sharding_filter -> read_geo(landsat8 & cdl) ->
  batch(8) -> collate(stack_samples)`` on a small synthetic corpus;
* ``geo-loader``: the same dataset and sampler as a map-style dataset, ``pipekit.DataLoader(dataset,
  batch_size=8, sampler=..., collate_fn=stack_samples)`` (a batch read through ``__getitems__``).

Run: ``./run bench call_counts``; to compare another checkout, run it with ``PYTHONPATH=OTHER/src``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
from collections import Counter
from pathlib import Path

import torch

import pipekit
from pipekit.pipes import IterableWrapper


def _plus_one(x: int) -> int:
    return x + 1


def _count(make, size_of, loader=None) -> tuple[float, Counter]:
    loader = loader or (lambda source: pipekit.DataLoader(source, num_workers=0))
    list(loader(make()))  # warm-up: imports, caches, handles
    profile = cProfile.Profile()
    profile.enable()
    items = sum(size_of(batch) for batch in loader(make()))
    profile.disable()
    stats = pstats.Stats(profile)
    per_function = Counter()
    for (path, _line, name), (_cc, calls, *_rest) in stats.stats.items():  # type: ignore[attr-defined]
        per_function[f"{Path(path).name}:{name}"] += calls
    return stats.total_calls / items, per_function  # type: ignore[attr-defined]


def pipes_chain(n: int) -> tuple[float, Counter]:
    def make():
        return IterableWrapper(list(range(n))).shuffle(buffer_size=1000).sharding_filter().map(_plus_one).batch(32)

    return _count(make, len)


def _read_and_close(item: tuple[str, object]) -> int:
    _url, stream = item
    size = len(stream.read())  # type: ignore[attr-defined]
    stream.close()  # type: ignore[attr-defined]
    return size


def files_chain(n: int, root: str) -> tuple[float, Counter]:
    folder = Path(root) / "files"
    for i in range(n):
        sub = folder / f"class{i % 4}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"{i:06d}.bin").write_bytes(b"x" * 64)

    def make():
        return (
            IterableWrapper([str(folder)])
            .list_files_by_fsspec(masks="*.bin", recursive=True)
            .shuffle()
            .sharding_filter()
            .open_files_by_fsspec(mode="rb")
            .map(_read_and_close)
            .batch(32)
        )

    return _count(make, len)


def geo_chain(n: int, root: str, map_style: bool = False) -> tuple[float, Counter]:
    from pipekit import datasets
    from pipekit.geo import RandomGeoSampler, stack_samples

    try:
        from pipekit.synthetic.geo import write_landsat_cdl_corpus
    except ImportError:  # pipekit before the synthetic package (to compare with older checkouts)
        from pipekit.synthetic.geo import write_landsat_cdl_corpus

    corpus = write_landsat_cdl_corpus(root, size=1024, scenes=1, progress=False)
    dataset = datasets.Landsat8(root=f"{corpus}/landsat8") & datasets.CDL(root=f"{corpus}/cdl")

    def make():
        sampler = RandomGeoSampler(dataset, size=128, length=n)
        if map_style:
            return sampler
        return sampler.as_pipe().set_seed(0).sharding_filter().read_geo(dataset).batch(8).collate(stack_samples)

    def loader(sampler):
        return pipekit.DataLoader(dataset, batch_size=8, sampler=sampler, collate_fn=stack_samples, num_workers=0)

    return _count(make, lambda batch: len(batch["image"]), loader if map_style else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=10_000, help="items of the pipes chain")
    parser.add_argument("--files", type=int, default=2000, help="files of the files chain")
    parser.add_argument("--samples", type=int, default=400, help="samples of the geo chain")
    parser.add_argument(
        "--chains", nargs="+", default=["pipes", "files", "geo"], choices=["pipes", "files", "geo", "geo-loader"]
    )
    parser.add_argument("--top", type=int, default=8, help="functions to list per chain")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"# call_counts: pipekit {pipekit.__version__} from {Path(pipekit.__file__).parent}")
    with tempfile.TemporaryDirectory() as tmp:
        chains = {
            "pipes": lambda: pipes_chain(args.items),
            "files": lambda: files_chain(args.files, tmp),
            "geo": lambda: geo_chain(args.samples, tmp),
            "geo-loader": lambda: geo_chain(args.samples, tmp, map_style=True),
        }
        for name in args.chains:
            per_item, functions = chains[name]()
            print(f"{name}: {per_item:.2f} Python calls per item")
            for function, calls in functions.most_common(args.top):
                print(f"    {calls:>9}  {function}")


if __name__ == "__main__":
    main()
