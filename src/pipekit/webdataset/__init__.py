"""The ``webdataset`` library's interface on pipekit's pipes: ``import pipekit.webdataset as wds``.

A training script written for the ``webdataset`` library runs with its import changed::

    import pipekit.webdataset as wds            # was: import webdataset as wds

    dataset = (
        wds.WebDataset("s3://bucket/train-{000000..000099}.tar", resampled=True, nodesplitter=wds.split_by_node)
        .shuffle(1000)
        .decode("torchrgb8")
        .to_tuple("jpg;png", "cls")
        .batched(64)
        .with_epoch(500)
    )
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=4).unbatched().shuffle(1000).batched(64)

The same names and arguments, with pipekit underneath: every stage is a pipekit pipe, so
``loader.state_dict()`` / ``load_state_dict()`` (or a ``pipekit.DataLoader`` over the dataset) resume
mid-epoch exactly, errors are pipekit's typed errors naming the shard and the stage, and what a
``handler`` skips is counted (``skip_report()``).  Differences from the library:

* ``shardshuffle=`` permutes the whole shard list each epoch (the same permutation in every worker and
  rank, before the split), instead of a buffer; ``.shuffle(n)`` is pipekit's seeded, resumable buffer
  shuffle (``initial=`` is not used).
* ``resampled=True`` draws an endless stream of shards per worker and rank, seeded from the DataLoader;
  ``.with_epoch(n)`` cuts it into epochs of ``n`` items per worker, so every rank gets the same number.
* ``pipe:CMD ARGS`` URLs run the command *without a shell* (arguments split as a shell would); shell
  syntax is refused, and a failing command's exit status and standard error are reported naming the URL.
* Remote URLs (``s3://``, ``gs://``, ``https://``...) are read with fsspec (``storage_options=`` for
  credentials and endpoints), with retries; ``cache_dir=`` keeps local copies, checked on each open.
* Names the library has and pipekit deliberately does not (``MultiShardSample``, ``RandomMix``, ``DBCache``,
  ``wids``...) raise an ``AttributeError`` naming the pipekit way.

``pipekit.datasets.WebDataset`` is pipekit's own recipe for the same shards (decoding to tensors,
resizing, batching in one call); this module is for code written against the library.
"""

from __future__ import annotations

from types import SimpleNamespace as _SimpleNamespace

from pipekit.pipes._shard_writer import ShardWriter, TarWriter
from pipekit.webdataset._decode import Decoder, ImageHandler, basichandlers, decode, imagehandler
from pipekit.webdataset._fluid import (
    DataPipeline,
    FluidInterface,
    FluidWrapper,
    WebDataset,
    single_node_only,
    split_by_node,
    split_by_worker,
    tarfile_to_samples,
)
from pipekit.webdataset._loader import WebLoader
from pipekit.webdataset._shardlists import ResampledShards, SimpleShardList
from pipekit.webdataset._stages import (
    batched,
    default_collation_fn,
    ignore_and_continue,
    ignore_and_stop,
    map,
    map_dict,
    map_tuple,
    rename,
    reraise_exception,
    select,
    shuffle,
    slice,
    to_tuple,
    unbatched,
    warn_and_continue,
    warn_and_stop,
)

__all__ = [
    "DataPipeline",
    "Decoder",
    "FluidInterface",
    "FluidWrapper",
    "ImageHandler",
    "ResampledShards",
    "ShardWriter",
    "SimpleShardList",
    "TarWriter",
    "WebDataset",
    "WebLoader",
    "basichandlers",
    "batched",
    "decode",
    "default_collation_fn",
    "ignore_and_continue",
    "ignore_and_stop",
    "imagehandler",
    "map",
    "map_dict",
    "map_tuple",
    "rename",
    "reraise_exception",
    "select",
    "shuffle",
    "single_node_only",
    "slice",
    "split_by_node",
    "split_by_worker",
    "tarfile_to_samples",
    "to_tuple",
    "unbatched",
    "warn_and_continue",
    "warn_and_stop",
]


# The library's submodules, as namespaces, for code that writes ``wds.handlers.warn_and_continue`` or
# ``wds.shardlists.split_by_node`` (``from webdataset.shardlists import ...`` becomes ``from pipekit.webdataset
# import ...``).
handlers = _SimpleNamespace(
    reraise_exception=reraise_exception, ignore_and_continue=ignore_and_continue,
    warn_and_continue=warn_and_continue, ignore_and_stop=ignore_and_stop, warn_and_stop=warn_and_stop,
)
shardlists = _SimpleNamespace(
    SimpleShardList=SimpleShardList, ResampledShards=ResampledShards, split_by_node=split_by_node,
    split_by_worker=split_by_worker, single_node_only=single_node_only,
)
filters = _SimpleNamespace(
    batched=batched, unbatched=unbatched, shuffle=shuffle, map=map, map_dict=map_dict, map_tuple=map_tuple,
    to_tuple=to_tuple, select=select, rename=rename, slice=slice, decode=decode,
    default_collation_fn=default_collation_fn, **vars(handlers),
)
autodecode = _SimpleNamespace(Decoder=Decoder, ImageHandler=ImageHandler, imagehandler=imagehandler,
                              basichandlers=basichandlers)
tariterators = _SimpleNamespace(tarfile_to_samples=tarfile_to_samples)
writer = _SimpleNamespace(ShardWriter=ShardWriter, TarWriter=TarWriter)


def __getattr__(name: str) -> object:
    """A ``webdataset`` name pipekit deliberately lacks raises ``AttributeError`` naming what to use instead."""
    import sys

    from pipekit.pipes._missing import missing_name

    # the caller: ``from pipekit.webdataset import X`` gets an ImportError naming the replacement (see missing_name)
    raise missing_name("webdataset", __name__, name, sys._getframe(1))
