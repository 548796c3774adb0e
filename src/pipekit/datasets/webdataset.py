"""The old module of :class:`pipekit.datasets.TarShards` (``datasets.WebDataset``), kept for imports."""

from pipekit.datasets.tar_shards import TarShards, WebDataset, expand_shard_urls

__all__ = ["TarShards", "WebDataset", "expand_shard_urls"]
