"""The writing side of the contract: ``write_shards`` in a DataLoader, checkpointed and resumed.

Invariant: the shards on disk at the end hold every sample exactly once (read back with
``load_from_tar`` + ``webdataset``), or a typed :class:`pipekit.errors.PipekitError` says why not,
within :data:`contract.harness.BOUND_S` seconds.
"""

from __future__ import annotations

import pickle
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import pipekit
from contract.harness import ContractBrokenError, watchdog
from pipekit.errors import PipekitError
from pipekit.pipes import IterableWrapper


@dataclass(frozen=True)
class WriteCase:
    samples: int = 12
    maxcount: int = 3
    shuffle: bool = False
    num_workers: int = 0
    persistent: bool = True
    stop_after: int | None = None  # shards yielded before a checkpoint and a resume; None: one run
    seed: int = 0


def sample(i: int) -> dict[str, Any]:
    return {"__key__": f"s{i:04d}", "cls": i}


def build(case: WriteCase, out: Path) -> Any:
    pipe = IterableWrapper(range(case.samples))
    if case.shuffle:
        pipe = pipe.shuffle(buffer_size=5)
    pipe = pipe.sharding_filter().map(sample)
    return pipe.write_shards(str(out / "part-%04d.tar"), maxcount=case.maxcount)


def loader_for(case: WriteCase, out: Path) -> pipekit.DataLoader:
    kwargs: dict[str, Any] = {"num_workers": case.num_workers, "batch_size": None}
    if case.num_workers:
        kwargs["persistent_workers"] = case.persistent
    return pipekit.DataLoader(build(case, out), **kwargs)


def written_keys(out: Path) -> Counter[str]:
    urls = [str(p) for p in sorted(out.glob("*.tar"))]
    if not urls:
        return Counter()
    samples = IterableWrapper(urls).open_files_by_fsspec(mode="rb").load_from_tar().webdataset()
    return Counter(s["__key__"].rsplit("/", 1)[1] for s in samples)


def run_write_case(case: WriteCase, out: Path) -> None:
    out.mkdir(parents=True)
    torch.manual_seed(case.seed)
    try:
        with watchdog("write_shards run"):
            loader = loader_for(case, out)
            try:
                if case.stop_after is None:
                    list(loader)
                else:
                    it = iter(loader)
                    for _ in range(case.stop_after):
                        if next(it, None) is None:
                            break
                    state = pickle.loads(pickle.dumps(loader.state_dict()))
                    loader.shutdown()
                    loader = loader_for(case, out)
                    loader.load_state_dict(state)
                    list(loader)
            finally:
                loader.shutdown()
    except PipekitError:
        return  # refused, typed (the message is the pipe's)
    except ContractBrokenError:
        raise
    except Exception as exc:
        raise ContractBrokenError(f"write_shards: untyped {type(exc).__name__}: {exc}"[:600]) from exc
    got = written_keys(out)
    want = Counter(f"s{i:04d}" for i in range(case.samples))
    if got != want:
        lost = sorted(set(want) - set(got))
        twice = sorted(k for k, n in got.items() if n > 1)
        raise ContractBrokenError(
            f"write_shards: the shards hold {sum(got.values())} samples of {case.samples}: "
            f"{len(lost)} lost {lost[:5]}, {len(twice)} written twice {twice[:5]}, nothing raised"
        )
