"""The datamodule bases: TorchGeo 0.8's ``BaseDataModule``, ``GeoDataModule`` and ``NonGeoDataModule``.

Same constructor arguments and hooks as TorchGeo's, with three differences a
user sees:

* the loaders are :class:`pipekit.DataLoader` s, whose ``state_dict()``
  Lightning saves in every checkpoint and restores on ``fit(ckpt_path=...)``:
  a run stopped mid-epoch resumes at the next batch, no sample repeated or
  skipped (their length is known, so Lightning fetches no batch ahead of the
  one it trains on, and the checkpoint is of exactly the batches trained);
* normalisation (``mean``/``std``) is done by :func:`pipekit.device.to_device`
  in :meth:`~BaseDataModule.transfer_batch_to_device`: integer images cross to
  the device as they are and are converted and normalised there in one kernel;
  ``aug``/``train_aug``... are augmentation only (pipekit's batch transforms,
  :mod:`pipekit.transforms.batch_augment`), applied on the device in
  ``on_after_batch_transfer``, and their random streams are saved in the
  checkpoint too (:meth:`~BaseDataModule.state_dict`), so a resumed run draws
  the same augmentation as one that never stopped;
* the training shuffle (and a geo datamodule's patches) come from ``seed``.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch import LightningDataModule
from torch import Tensor, nn
from torch.utils.data import Dataset, DistributedSampler, Subset, default_collate

from pipekit._loader import DataLoader
from pipekit._validate import check_int
from pipekit.datamodules._loaders import EpochEndAwareLoader, SeededShuffle
from pipekit.device import to_device
from pipekit.errors import ConfigurationError
from pipekit.transforms.seeding import RandomStream

__all__ = ["BaseDataModule", "GeoDataModule", "NonGeoDataModule"]

SPLITS = ("train", "val", "test", "predict")
_RANKS = "ranks"  # a distributed run's state: one dict of streams per rank


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
_Transform = Callable[[Any], Any]


def _streams(module: Any) -> dict[str, RandomStream]:
    """The random streams of an augmentation (a batch transform and the transforms inside it), by module path."""
    if not isinstance(module, nn.Module):
        stream = getattr(module, "stream", None)
        return {"": stream} if isinstance(stream, RandomStream) else {}
    return {
        name: m.stream for name, m in module.named_modules() if isinstance(getattr(m, "stream", None), RandomStream)
    }


class BaseDataModule(LightningDataModule):
    """What the geo and non-geo datamodules share: datasets per split, device-side normalisation and augmentation.

    Args:
        dataset_class: the dataset class; each split is
            ``dataset_class(split=..., **kwargs)`` unless a subclass's
            :meth:`setup` builds it otherwise.
        batch_size: samples per batch (``train_batch_size``... override it per split).
        num_workers: DataLoader worker processes.
        seed: seed of the training loader's shuffle (a ``torch.Generator``
            per ``train_dataloader()``), of what a subclass draws at random,
            and of the default augmentation streams.
        **kwargs: passed to ``dataset_class``.

    Attributes:
        mean, std: per-band statistics for normalisation, in the data's own
            units (TorchGeo's default: 0 and 255); a subclass stores its
            dataset's (computed by :func:`pipekit.datamodules.compute_stats`).
        aug, train_aug, val_aug, test_aug, predict_aug: augmentation of a
            batch on the device (``None``: the split uses ``aug``; ``aug``
            ``None``: no augmentation).
        mask_dtype: dtype masks are converted to on the device (``None``: as they are).
    """

    mean: Tensor = torch.tensor(0.0)
    std: Tensor = torch.tensor(255.0)
    mask_dtype: torch.dtype | None = None

    def __init__(
        self,
        dataset_class: type[Dataset[dict[str, Tensor]]],
        batch_size: int = 1,
        num_workers: int = 0,
        *,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        where = type(self).__name__
        self.dataset_class = dataset_class
        self.batch_size = check_int(batch_size, "batch_size", where, minimum=1)
        self.num_workers = check_int(num_workers, "num_workers", where, minimum=0)
        self.seed = check_int(seed, "seed", where, minimum=0)
        self.kwargs = kwargs

        self.dataset: Dataset[dict[str, Tensor]] | None = None
        self.train_dataset: Dataset[dict[str, Tensor]] | None = None
        self.val_dataset: Dataset[dict[str, Tensor]] | None = None
        self.test_dataset: Dataset[dict[str, Tensor]] | None = None
        self.predict_dataset: Dataset[dict[str, Tensor]] | None = None

        self.train_batch_size: int | None = None
        self.val_batch_size: int | None = None
        self.test_batch_size: int | None = None
        self.predict_batch_size: int | None = None

        self.aug: _Transform | None = None
        self.train_aug: _Transform | None = None
        self.val_aug: _Transform | None = None
        self.test_aug: _Transform | None = None
        self.predict_aug: _Transform | None = None

        self.collate_fn: Callable[[list[Any]], Any] = default_collate

    def prepare_data(self) -> None:
        """Download the data (once, on one process) when ``download=True`` was passed."""
        if self.kwargs.get("download", False):
            self.dataset_class(**self.kwargs)

    def _valid_attribute(self, *names: str) -> Any:
        """The first of the attributes ``names`` that is set; ConfigurationError if none is, or it is empty."""
        for name in names:
            value = getattr(self, name)
            if value is None:
                continue
            if not value:
                raise ConfigurationError(f"{type(self).__name__}.{name} has length 0")
            return value
        raise ConfigurationError(f"{type(self).__name__}.setup must define one of {names}")

    def _split_of_trainer(self) -> str | None:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return None
        if trainer.training:
            return "train"
        if trainer.validating or trainer.sanity_checking:
            return "val"
        if trainer.testing:
            return "test"
        if trainer.predicting:
            return "predict"
        return None

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move ``batch`` to ``device`` with :func:`pipekit.device.to_device`, normalising its images there.

        Integer images travel as they are and become float32 ``(x - mean) / std``
        on the device; masks become :attr:`mask_dtype`; other tensors move
        unchanged and non-tensor entries (``crs``, ``bounds``) stay.
        """
        return to_device(batch, device, normalize=(self.mean, self.std), scale=1.0, mask_dtype=self.mask_dtype)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Augment the batch on the device with the split's augmentation (``train_aug``..., else ``aug``)."""
        split = self._split_of_trainer()
        if split is None:
            return batch
        aug = getattr(self, f"{split}_aug", None) or self.aug
        return batch if aug is None else aug(batch)

    def state_dict(self) -> dict[str, Any]:
        """The positions of the augmentations' random streams (Lightning saves them in each checkpoint).

        Under ``torch.distributed`` every rank's streams, gathered (Lightning
        asks every rank and writes rank 0's dict), so each rank goes on with its own.
        """
        own: dict[str, Any] = {}
        for split in ("", *(f"{s}_" for s in SPLITS)):
            for path, stream in _streams(getattr(self, f"{split}aug", None)).items():
                own[f"{split}aug/{path}"] = stream.state_dict()
        if _world_size() > 1:
            ranks: list[Any] = [None] * _world_size()
            dist.all_gather_object(ranks, own)
            return {_RANKS: ranks}
        return own

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue the augmentations' random streams from a checkpoint's :meth:`state_dict`."""
        if _RANKS in state_dict:
            ranks = state_dict[_RANKS]
            rank = dist.get_rank() if _world_size() > 1 else 0
            if len(ranks) != _world_size():
                warnings.warn(f"{type(self).__name__}: the checkpoint holds the augmentation streams of "
                              f"{len(ranks)} ranks, this run has {_world_size()}; the streams start afresh",
                              UserWarning, stacklevel=2)
                return
            state_dict = ranks[rank]
        for key, value in state_dict.items():
            name, _, path = key.partition("/")
            stream = _streams(getattr(self, name, None)).get(path)
            if stream is not None:
                stream.load_state_dict(value)

    def plot(self, *args: Any, **kwargs: Any) -> Any:
        """The ``plot`` of the dataset (or the validation dataset), where it has one; else ``None``."""
        dataset = self.dataset or self.val_dataset
        if isinstance(dataset, Subset):
            dataset = dataset.dataset
        if dataset is not None and hasattr(dataset, "plot"):
            return dataset.plot(*args, **kwargs)
        return None

    def _loader(self, dataset: Any, split: str, **kwargs: Any) -> DataLoader:
        return EpochEndAwareLoader(
            dataset,
            num_workers=self.num_workers,
            collate_fn=self.collate_fn,
            persistent_workers=self.num_workers > 0,
            **kwargs,
        )

    def train_dataloader(self) -> DataLoader:
        """The training loader (a :class:`pipekit.DataLoader`, resumable mid-epoch)."""
        return self._dataloader_factory("train")

    def val_dataloader(self) -> DataLoader:
        """The validation loader."""
        return self._dataloader_factory("val")

    def test_dataloader(self) -> DataLoader:
        """The test loader."""
        return self._dataloader_factory("test")

    def predict_dataloader(self) -> DataLoader:
        """The prediction loader."""
        return self._dataloader_factory("predict")

    def _dataloader_factory(self, split: str) -> DataLoader:  # pragma: no cover - abstract
        raise NotImplementedError


class NonGeoDataModule(BaseDataModule):
    """A datamodule over a chip dataset with named splits (TorchGeo 0.8's ``NonGeoDataModule``).

    :meth:`setup` builds ``dataset_class(split=name, **kwargs)`` for each
    split the stage needs (``split_names`` maps pipekit's ``train``/``val``/
    ``test`` to the dataset's own names); the training loader shuffles with
    a generator seeded by ``seed`` and drops the last partial batch.

    Args:
        dataset_class: a map-style dataset class taking ``split=``.
        batch_size: samples per batch.
        num_workers: DataLoader worker processes.
        split_names: the dataset's name of each split (default: the same names).
        seed: seed of the training shuffle.
        **kwargs: passed to ``dataset_class`` (``root=``, ``bands=``, ``download=``...).

    Example:
        >>> import torch
        >>> from pipekit.datamodules import NonGeoDataModule
        >>> class Squares(torch.utils.data.Dataset):
        ...     def __init__(self, split, n=8):
        ...         self.n = n if split == "train" else 4
        ...     def __len__(self):
        ...         return self.n
        ...     def __getitem__(self, i):
        ...         return {"image": torch.full((1, 2, 2), i, dtype=torch.uint8), "label": torch.tensor(i)}
        >>> dm = NonGeoDataModule(Squares, batch_size=4, seed=0)
        >>> dm.setup("fit")
        >>> [batch["label"].tolist() for batch in dm.train_dataloader()]
        [[2, 3, 0, 4], [7, 5, 6, 1]]
        >>> len(dm.val_dataloader())
        1
    """

    def __init__(
        self,
        dataset_class: type[Dataset[dict[str, Tensor]]],
        batch_size: int = 1,
        num_workers: int = 0,
        *,
        split_names: dict[str, str] | None = None,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset_class, batch_size, num_workers, seed=seed, **kwargs)
        names = {"train": "train", "val": "val", "test": "test"}
        if split_names is not None:
            unknown = sorted(set(split_names) - set(names))
            if unknown:
                raise ValueError(f"{type(self).__name__}: split_names keys must be train, val, test; got {unknown}")
            names.update(split_names)
        self.split_names = names

    def _make(self, split: str) -> Dataset[dict[str, Tensor]]:
        return self.dataset_class(split=self.split_names[split], **self.kwargs)  # type: ignore[call-arg]

    def setup(self, stage: str) -> None:
        """Build the datasets of ``stage``: ``"fit"`` train and val, ``"validate"`` val, ``"test"`` test."""
        if stage == "fit":
            self.train_dataset = self._make("train")
        if stage in ("fit", "validate"):
            self.val_dataset = self._make("val")
        if stage == "test":
            self.test_dataset = self._make("test")

    def _dataloader_factory(self, split: str) -> DataLoader:
        dataset = self._valid_attribute(f"{split}_dataset", "dataset")
        batch_size = self._valid_attribute(f"{split}_batch_size", "batch_size")
        train = split == "train"
        trainer = getattr(self, "trainer", None)
        if train and trainer is not None and trainer.world_size > 1:
            # Each rank its share of a permutation drawn from seed and epoch, from where the epoch is:
            # Lightning's own wrapper around the seeded shuffle would hide its position from the checkpoint.
            sampler = DistributedSampler(dataset, num_replicas=trainer.world_size, rank=trainer.global_rank,
                                         shuffle=True, seed=self.seed, drop_last=True)
            sampler.set_epoch(trainer.current_epoch)
            return self._loader(dataset, split, batch_size=batch_size, sampler=sampler, drop_last=True)
        if train:
            # Each epoch's order from (seed, epoch), resumable (see pipekit.datamodules._loaders)
            sampler = SeededShuffle(len(dataset), self.seed)
            return self._loader(dataset, split, batch_size=batch_size, sampler=sampler, drop_last=True)
        return self._loader(dataset, split, batch_size=batch_size)


class GeoDataModule(BaseDataModule):
    """A datamodule over a geo dataset: random patches for training, a grid for evaluation (TorchGeo 0.8's).

    :meth:`setup` builds ``dataset_class(split=..., **kwargs)`` per split
    (a subclass may split one dataset geographically instead, as
    :class:`~pipekit.datamodules.LandsatCDLDataModule` does); training
    batches come from a :class:`~pipekit.geo.RandomBatchGeoSampler` of
    ``length`` patches per epoch, seeded by ``seed``, evaluation from a
    :class:`~pipekit.geo.GridGeoSampler` with stride ``patch_size``, collated
    by :func:`~pipekit.geo.stack_samples`.

    Args:
        dataset_class: a geo dataset class taking ``split=``.
        batch_size: patches per batch.
        patch_size: patch side in pixels, or ``(height, width)``.
        length: training patches per epoch (default: as many as tile the data).
        num_workers: DataLoader worker processes.
        seed: seed of the training sampler.
        **kwargs: passed to ``dataset_class``.
    """

    def __init__(
        self,
        dataset_class: type[Any],
        batch_size: int = 1,
        patch_size: int | tuple[int, int] = 64,
        length: int | None = None,
        num_workers: int = 0,
        *,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset_class, batch_size, num_workers, seed=seed, **kwargs)
        where = type(self).__name__
        sizes = patch_size if isinstance(patch_size, tuple) else (patch_size, patch_size)
        if len(sizes) != 2 or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in sizes):
            raise TypeError(f"{where}: patch_size must be an int or an (height, width) pair, got {patch_size!r}")
        for s in sizes:
            check_int(s, "patch_size", where, minimum=1)
        self.patch_size = patch_size
        self.length = check_int(length, "length", where, minimum=1, allow_none=True)
        from pipekit.geo._collate import stack_samples

        self.collate_fn = stack_samples
        self.sampler: Any = None
        self.train_sampler: Any = None
        self.val_sampler: Any = None
        self.test_sampler: Any = None
        self.predict_sampler: Any = None
        self.batch_sampler: Any = None
        self.train_batch_sampler: Any = None
        self.val_batch_sampler: Any = None
        self.test_batch_sampler: Any = None
        self.predict_batch_sampler: Any = None

    def _samplers(self, stage: str) -> None:
        """The samplers of the splits built for ``stage``: random batches for training, a grid for the rest."""
        from pipekit.geo.samplers import GridGeoSampler, RandomBatchGeoSampler

        if stage == "fit":
            self.train_batch_sampler = RandomBatchGeoSampler(
                self.train_dataset, self.patch_size, self.batch_size, self.length,
                generator=torch.Generator().manual_seed(self.seed),
            )
        for split in ("val", "test", "predict"):
            dataset = getattr(self, f"{split}_dataset")
            if dataset is not None and getattr(self, f"{split}_sampler") is None:
                setattr(self, f"{split}_sampler", GridGeoSampler(dataset, self.patch_size, self.patch_size))

    def setup(self, stage: str) -> None:
        """Build the datasets of ``stage`` (``dataset_class(split=...)``) and their samplers."""
        if stage == "fit":
            self.train_dataset = self.dataset_class(split="train", **self.kwargs)  # type: ignore[call-arg]
        if stage in ("fit", "validate"):
            self.val_dataset = self.dataset_class(split="val", **self.kwargs)  # type: ignore[call-arg]
        if stage == "test":
            self.test_dataset = self.dataset_class(split="test", **self.kwargs)  # type: ignore[call-arg]
        self._samplers(stage)

    def _dataloader_factory(self, split: str) -> DataLoader:
        from pipekit.geo.samplers import BatchGeoSampler, DistributedGeoSampler, GeoSampler

        dataset = self._valid_attribute(f"{split}_dataset", "dataset")
        sampler = self._valid_attribute(f"{split}_batch_sampler", f"{split}_sampler", "batch_sampler", "sampler")
        batch_size = self._valid_attribute(f"{split}_batch_size", "batch_size")
        trainer = getattr(self, "trainer", None)
        if trainer is not None and trainer.world_size > 1 and isinstance(sampler, GeoSampler):
            # under DDP each process takes its share of the epoch; a DistributedSampler, so Lightning keeps it
            share = DistributedGeoSampler(sampler, num_replicas=trainer.world_size, rank=trainer.global_rank)
            return self._loader(dataset, split, batch_size=share.batch_size or batch_size, sampler=share)
        if isinstance(sampler, BatchGeoSampler):
            return self._loader(dataset, split, batch_sampler=sampler)
        return self._loader(dataset, split, batch_size=batch_size, sampler=sampler)
