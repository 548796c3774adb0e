"""``WebDataset``, ``DataPipeline`` and the fluid methods (``.shuffle(n).decode("pil").to_tuple(...)``).

A fluid object is an ordinary pipekit pipe (an ``IterDataPipe`` holding the pipeline it built in
``source_datapipe``): ``pipekit.DataLoader`` checkpoints it exactly, torch's DataLoader shards it, and each
method returns a new object with one more stage, as the library's ``compose`` does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pipekit.pipes.base import IterDataPipe
from pipekit.pipes.state import ResumablePipe
from pipekit.webdataset import _stages as st
from pipekit.webdataset._decode import decode as _decode_stage
from pipekit.webdataset._reading import PipeOpener, WdsSamples
from pipekit.webdataset._shardlists import ResampledShards, SimpleShardList

__all__ = [
    "DataPipeline",
    "FluidInterface",
    "FluidWrapper",
    "WebDataset",
    "single_node_only",
    "split_by_node",
    "split_by_worker",
    "tarfile_to_samples",
]


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _worker() -> tuple[int, int]:
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


class SplitShards(ResumablePipe):
    """``split_by_node`` / ``split_by_worker``: this rank's / worker's share of the shard URLs.

    ``i % ranks == rank`` (by node), then ``j % workers == worker`` over what is left (by worker): the
    library's rule.  Both at once are torch's ``sharding_filter`` rule, so the DataLoader's
    ``apply_sharding(workers x ranks, worker x ranks + rank)`` configures it; without a DataLoader it reads the
    rank and worker itself.  Resume: the number of URLs seen.
    """

    state_keys = ("seen",)

    def __init__(self, source_datapipe: IterDataPipe, by_node: bool, by_worker: bool) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self.by_node, self.by_worker = by_node, by_worker
        self._share: tuple[int, int] | None = None
        self._seen = 0

    def apply_sharding(self, num_of_instances: int, instance_id: int, sharding_group: Any = None) -> None:
        ranks = _world()[1]
        ranks = ranks if num_of_instances % ranks == 0 else 1
        rank, worker, workers = instance_id % ranks, instance_id // ranks, num_of_instances // ranks
        self._share = self._modulus(rank, ranks, worker, workers)

    def _modulus(self, rank: int, ranks: int, worker: int, workers: int) -> tuple[int, int]:
        if self.by_node and self.by_worker:
            return ranks * workers, worker * ranks + rank
        if self.by_node:
            return ranks, rank
        return (workers, worker) if self.by_worker else (1, 0)

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self._seen}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._seen = 0 if state is None else int(state["seen"])

    def __iter__(self) -> Iterator[Any]:
        if self._share is None:
            (rank, ranks), (worker, workers) = _world(), _worker()
            modulus, residue = self._modulus(rank, ranks, worker, workers)
        else:
            modulus, residue = self._share
        for item in self.source_datapipe:
            i = self._seen
            self._seen += 1
            if i % modulus == residue:
                yield item


class SingleNodeOnly(IterDataPipe):
    """The library's default ``nodesplitter``: refuses to run on several ranks, where it would repeat shards."""

    stateless = True

    def __init__(self, source_datapipe: IterDataPipe) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[Any]:
        if _world()[1] > 1:
            raise ValueError(
                f"pipekit.webdataset.WebDataset: running on {_world()[1]} ranks, but nodesplitter is single_node_only "
                "(the default), so every rank would read every shard; pass nodesplitter=wds.split_by_node, or "
                "resampled=True with .with_epoch(n) for equal-length epochs on every rank"
            )
        yield from self.source_datapipe


def split_by_node(src: Any, group: Any = None) -> IterDataPipe:
    """This rank's share of the shard URLs (``urls[rank::world_size]``), as a pipe."""
    pipe = st.as_pipe(src)
    if isinstance(pipe, SplitShards):
        return SplitShards(pipe.source_datapipe, True, pipe.by_worker)
    return SplitShards(pipe, by_node=True, by_worker=False)


def split_by_worker(src: Any) -> IterDataPipe:
    """This DataLoader worker's share of the shard URLs (``urls[worker::num_workers]``), as a pipe."""
    pipe = st.as_pipe(src)
    if isinstance(pipe, SplitShards):
        return SplitShards(pipe.source_datapipe, pipe.by_node, True)
    return SplitShards(pipe, by_node=False, by_worker=True)


def single_node_only(src: Any, group: Any = None) -> IterDataPipe:
    """The default ``nodesplitter``: every shard, on one rank only (several ranks raise ``ValueError``)."""
    return SingleNodeOnly(st.as_pipe(src))


_URL_STAGES = (split_by_node, split_by_worker, single_node_only)


def _urls_of(pipe: Any) -> list[str] | None:
    for _ in range(64):
        urls = getattr(pipe, "urls", None) or getattr(pipe, "items", None)
        if isinstance(urls, list) and urls and all(isinstance(u, str) for u in urls):
            return urls
        pipe = getattr(pipe, "source_datapipe", None)
        if pipe is None:
            return None
    return None


class tarfile_to_samples:  # noqa: N801  (the library's name)
    """``wds.tarfile_to_samples(handler=)``: shard URLs -> the library's sample dicts.

    ``pipe:`` URLs run their command (see :mod:`pipekit.webdataset`); other URLs open with fsspec
    (``storage_options=``), from a local copy with ``cache_dir=``.
    """

    is_pipe_stage = True

    def __init__(self, handler: Any = st.reraise_exception, cache_dir: str | os.PathLike[str] | None = None,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        self.handler = st._check_handler(handler, "tarfile_to_samples")
        self.cache_dir = cache_dir
        self.storage_options = dict(storage_options or {})

    def __call__(self, pipe: Any) -> IterDataPipe:
        from pipekit.datasets._shard_cache import CachedShardOpener

        pipe = st.as_pipe(pipe)
        urls = _urls_of(pipe) or []
        skip = self.handler in st.CONTINUE_HANDLERS
        if urls and all(u.startswith("pipe:") for u in urls):
            opened: IterDataPipe = PipeOpener(pipe)
        elif self.cache_dir is not None:
            opened = CachedShardOpener(pipe, self.cache_dir, self.storage_options)
        else:
            opened = pipe.open_files_by_fsspec(
                mode="rb", storage_options=self.storage_options or None, on_error="skip" if skip else "raise"
            )
        samples: IterDataPipe = WdsSamples(opened.load_tar_samples(on_error="skip" if skip else "raise"), urls)
        if not skip and self.handler is not st.reraise_exception:
            samples = _StopOnError(samples, self.handler)
        return samples


class _StopOnError(IterDataPipe):
    """A stop (or custom) handler at the reading stage: an error ends the epoch once the handler has seen it."""

    stateless = True

    def __init__(self, source_datapipe: IterDataPipe, handler: Callable[[BaseException], bool]) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self.handler = handler
        self.skip_log = st.SkipLog("tarfile_to_samples")

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from self.source_datapipe
        except Exception as exc:
            self.handler(exc)  # re-raises, or returns: a failed reader cannot continue, so the epoch ends
            self.skip_log.record(exc)


def _apply(stage: Any, pipe: IterDataPipe, urls: bool = False) -> IterDataPipe:
    if getattr(stage, "is_pipe_stage", False) or stage in _URL_STAGES:  # pipe -> pipe
        return stage(pipe)
    if isinstance(stage, IterDataPipe):
        raise TypeError(f"pipekit.webdataset: a pipe can only be the first stage of a pipeline, got {stage!r:.80}")
    if not callable(stage):
        raise TypeError(f"pipekit.webdataset: a stage must be callable (iterator -> iterator), got {stage!r:.80}")
    return st.GeneratorStage(pipe, stage, urls=urls)


class FluidInterface:
    """The library's chaining methods; each returns a new object with one more stage (``compose``)."""

    def compose(self, *stages: Any) -> Any:
        raise NotImplementedError

    def batched(self, batchsize: int, collation_fn: Callable | None = st.default_collation_fn,
                partial: bool = True) -> Any:
        """Groups of ``batchsize`` items, collated by ``collation_fn`` (``None``: lists)."""
        return self.compose(st.batched(batchsize, collation_fn=collation_fn, partial=partial))

    def unbatched(self) -> Any:
        """The items of each batch, one by one."""
        return self.compose(st.unbatched())

    def listed(self, batchsize: int, partial: bool = True) -> Any:
        """Groups of ``batchsize`` items as lists."""
        return self.compose(st.batched(batchsize, collation_fn=None, partial=partial))

    def shuffle(self, size: int, **kw: Any) -> Any:
        """Shuffle in a buffer of ``size`` items (pipekit's resumable ``shuffle``); ``size < 1`` does nothing."""
        return self if size < 1 else self.compose(st.shuffle(size, **kw))

    def map(self, f: Callable[[Any], Any], handler: Any = st.reraise_exception) -> Any:
        """``f(item)`` for each item (``None`` drops it)."""
        return self.compose(st.map(f, handler=handler))

    def decode(self, *args: Any, pre: Any = None, post: Any = None, only: Any = None, partial: bool = False,
               handler: Any = st.reraise_exception) -> Any:
        """Decode fields: image specs (``"pil"``, ``"rgb8"``, ``"torchrgb8"``...) and handler functions."""
        return self.compose(_decode_stage(*args, pre=pre, post=post, only=only, partial=partial, handler=handler))

    def map_dict(self, handler: Any = st.reraise_exception, **kw: Callable) -> Any:
        """Apply a function to each named field."""
        return self.compose(st.map_dict(handler=handler, **kw))

    def select(self, predicate: Callable[[Any], bool], **kw: Any) -> Any:
        """Keep the items ``predicate`` accepts."""
        return self.compose(st.select(predicate, **kw))

    def to_tuple(self, *args: str, handler: Any = st.reraise_exception, missing_is_error: bool = True) -> Any:
        """The named fields as tuples (``"jpg;png"``: the first present)."""
        return self.compose(st.to_tuple(*args, handler=handler, missing_is_error=missing_is_error))

    def map_tuple(self, *args: Callable | None, handler: Any = st.reraise_exception) -> Any:
        """Apply the i-th function to the i-th element of each tuple."""
        return self.compose(st.map_tuple(*args, handler=handler))

    def slice(self, *args: int | None) -> Any:
        """``itertools.islice`` of the items."""
        return self.compose(st.slice(*args))

    def rename(self, **kw: Any) -> Any:
        """Rename fields: ``rename(image="jpg;png", keep=False)``."""
        return self.compose(st.rename(**kw))


class FluidWrapper(IterDataPipe, FluidInterface):
    """A pipe with the fluid methods (the library's ``FluidWrapper``); ``with_epoch``/``with_length`` too.

    Example:
        >>> import pipekit.webdataset as wds
        >>> list(wds.FluidWrapper([(1, "a"), (2, "b"), (3, "c")]).map_tuple(lambda x: x * 10).batched(2))
        [[array([10, 20]), ['a', 'b']], [array([30]), ['c']]]
    """

    stateless = True

    def __init__(self, initial: Any) -> None:
        super().__init__()
        self.source_datapipe = st.as_pipe(initial)
        self.length: int | None = None

    def _copy(self, pipe: IterDataPipe) -> Any:
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.source_datapipe = pipe
        return new

    def compose(self, *stages: Any) -> Any:
        """A copy with ``stages`` (``pipe -> pipe`` stages, or generator functions) appended."""
        pipe = self.source_datapipe
        for stage in stages:
            pipe = _apply(stage, pipe)
        return self._copy(pipe)

    def with_epoch(self, nsamples: int = -1, nbatches: int = -1) -> Any:
        """Endless repetition of the pipeline, cut into epochs of ``nsamples`` items (per worker, as in the library).

        With ``resampled=True`` every rank and worker then yields exactly ``nsamples`` items per epoch.
        """
        n = nsamples if nsamples >= 0 else nbatches
        if n < 0:
            return self
        return self._copy(self.source_datapipe.cycle().header(n))

    def repeat(self, nepochs: int | None = None, nbatches: int | None = None) -> Any:
        """The pipeline ``nepochs`` times over (``None``: forever)."""
        pipe = self.source_datapipe.cycle(nepochs)
        return self._copy(pipe if nbatches is None else pipe.header(nbatches))

    def with_length(self, n: int, silent: bool = False) -> Any:
        """Report ``len() == n`` (the items are not limited: use ``with_epoch`` for that)."""
        new = self._copy(self.source_datapipe)
        new.length = n
        return new

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError(f"{type(self).__name__} has no length: set one with .with_length(n)")
        return self.length

    def __iter__(self) -> Iterator[Any]:
        yield from self.source_datapipe


class DataPipeline(FluidWrapper):
    """``wds.DataPipeline(source, stage, ...)``: a source (shard list, pipe or list) then ``pipe -> pipe`` stages.

    Stages are the library's filters (``wds.shuffle(100)``, ``wds.split_by_worker``,
    ``wds.tarfile_to_samples()``, ``wds.decode("torchrgb")``...) or generator functions ``f(iterator)``.
    """

    def __init__(self, *stages: Any) -> None:
        if not stages:
            raise ValueError("pipekit.webdataset.DataPipeline: needs a source (a shard list, a pipe or a list)")
        first, rest = stages[0], stages[1:]
        if isinstance(first, list | tuple):
            source: Any = first
        elif isinstance(first, IterDataPipe):
            source = first
        elif callable(first):
            source = first()
        else:
            source = first
        super().__init__(source)
        pipe = self.source_datapipe
        is_urls = _urls_of(pipe) is not None
        for stage in rest:
            pipe = _apply(stage, pipe, urls=is_urls)
            if isinstance(stage, tarfile_to_samples):
                is_urls = False
        self.source_datapipe = pipe


class WebDataset(DataPipeline):
    """``wds.WebDataset(urls, ...)``: tar shards -> the library's sample dicts, on pipekit's pipes.

    Samples are ``{"__key__": "sample0001", "__url__": shard URL, "jpg": b"...", "cls": b"3"}``.

    Args:
        urls: a brace pattern (``"s3://b/train-{000000..000099}.tar"``), ``"a.tar::b.tar"``, a list, a folder
            or glob, ``pipe:CMD`` URLs, or a pipe yielding URLs.
        handler: what an error does (:func:`~pipekit.webdataset.reraise_exception`, the default, raises;
            ``ignore_and_continue``/``warn_and_continue`` skip the shard or member, counted in ``skip_log``).
        resampled: draw shards at random with replacement, endlessly, in each worker and rank (use
            ``with_epoch`` to cut epochs); no split by node or worker is needed.
        shardshuffle: shuffle the whole shard list each epoch (any true value; the library's buffer size is
            not needed: pipekit permutes the list).
        nodesplitter, workersplitter: :func:`split_by_node`, :func:`split_by_worker`,
            :func:`single_node_only` (the default node splitter: refuses several ranks), ``None``, or a
            generator function over ``{"url": ...}`` dicts.
        empty_check: raise when a process's share yields no sample.
        cache_dir: copy remote shards there on first use and read the copy afterwards.
        repeat: read the shard list again and again.
        seed: the shard shuffle's / draw's seed for the first epoch.
        storage_options: fsspec options for remote shards (``{"anon": True}``, ``endpoint_url``...).

    ``mode``, ``cache_size``, ``url_to_name``, ``detshuffle`` and ``verbose`` are accepted and not needed.

    Example:
        >>> import tempfile, torch
        >>> import pipekit.webdataset as wds
        >>> root = tempfile.mkdtemp()
        >>> with wds.ShardWriter(root + "/s-%02d.tar", maxcount=2, verbose=0) as sink:
        ...     for i in range(3):
        ...         sink.write({"__key__": f"k{i}", "cls": i, "txt": f"item {i}"})
        >>> ds = wds.WebDataset(root + "/s-{00..01}.tar", shardshuffle=False).decode().to_tuple("txt", "cls")
        >>> list(ds)
        [('item 0', 0), ('item 1', 1), ('item 2', 2)]
    """

    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str] | IterDataPipe,
        handler: Any = st.reraise_exception,
        mode: str | None = None,
        resampled: bool = False,
        repeat: bool = False,
        shardshuffle: bool | int | None = None,
        cache_size: int = -1,
        cache_dir: str | os.PathLike[str] | None = None,
        url_to_name: Any = None,
        detshuffle: bool = False,
        nodesplitter: Any = single_node_only,
        workersplitter: Any = split_by_worker,
        select_files: Any = None,
        rename_files: Any = None,
        empty_check: bool = True,
        verbose: bool = False,
        seed: int | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if select_files is not None or rename_files is not None:
            raise ValueError(
                "pipekit.webdataset.WebDataset: select_files= and rename_files= are not supported; select and "
                "rename fields after reading with .select(...) / .rename(...) / .map(...)"
            )
        if isinstance(urls, Mapping) or (isinstance(urls, str) and urls.endswith((".yaml", ".yml"))):
            raise ValueError(
                "pipekit.webdataset.WebDataset: dataset specs (.yaml / dict, the library's MultiShardSample) are "
                "not supported; list the shards, or mix several WebDatasets with pipekit.pipes.SampleMultiplexer"
            )
        resampled = resampled or mode == "resampled"
        if isinstance(urls, IterDataPipe):
            pipe: IterDataPipe = urls
        elif resampled:
            pipe = ResampledShards(urls, seed=seed)  # type: ignore[arg-type]
        else:
            pipe = SimpleShardList(urls, seed=seed, shuffle=bool(shardshuffle))  # type: ignore[arg-type]
        if not resampled:
            for splitter in (nodesplitter, workersplitter):
                if splitter is not None:
                    pipe = _apply(splitter, pipe, urls=True)
        if repeat:
            pipe = pipe.cycle()
        pipe = tarfile_to_samples(handler, cache_dir=cache_dir, storage_options=storage_options)(pipe)
        if empty_check:
            pipe = st.CheckEmpty(pipe)
        super().__init__(pipe)
