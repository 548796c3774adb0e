"""megatron-energon's and NVIDIA DALI's loaders for ``benchmarks/_peers.py`` (only the ``peers`` environment has them).

energon reads the tar shards themselves, after its ``prepare`` step (an index
and a split under ``.nv-meta``, written once into a folder of links to the
shards): ``get_train_dataset(..., shuffle_buffer_size=buffer,
max_samples_per_sequence=100)`` (energon's documented setting) in
``get_loader``, with a task encoder doing the same torchvision decode + ops as
the other loaders (its own decoder turned off: energon's default decodes with
PIL through webdataset's handlers).  Its training datasets never end: an epoch
is the shards' number of samples, taken from one iterator that lives on.

DALI's CPU pipeline (``device_id=None``) as its users write one:
``fn.readers.webdataset`` (random shuffle with an ``initial_fill`` of the
buffer's size), ``fn.decoders.image_random_crop`` (decodes only the crop's
region: DALI's fused crop-decode, RandomResizedCrop's scale and ratio),
``fn.resize`` to the size and ``fn.crop_mirror_normalize`` (uint8, CHW, a random
horizontal flip); ``num_threads`` is 1 for the 0-worker cell and 2 for the
2-worker cell.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from _peers import DecodeCrop, _converted, _mark


class _Epochs:
    """``batches`` batches of an endless loader per ``iter()``, from one iterator that lives on."""

    def __init__(self, loader: Any, batches: int) -> None:
        self.loader, self.batches, self.it = loader, batches, None

    def __iter__(self) -> Iterator[Any]:
        if self.it is None:
            self.it = iter(self.loader)
        for _ in range(self.batches):
            yield next(self.it)


def _energon_dir(spec: dict[str, Any]) -> Path:
    from megatron.energon.flavors.webdataset.prepare import WebdatasetPreparator

    out = Path(spec["convert_root"]) / "energon"
    if not _converted(out, spec["shards"]):
        import shutil

        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        names = []
        for shard in spec["shards"]:
            (out / Path(shard).name).symlink_to(shard)
            names.append(Path(shard).name)
        WebdatasetPreparator.prepare_dataset(out, names, split_parts_ratio=[("train", 1.0)], workers=1)
        (out / ".nv-meta" / "dataset.yaml").write_text(
            "sample_type:\n  __module__: megatron.energon\n  __class__: ImageClassificationSample\n"
            "field_map:\n  image: jpg\n  label: cls\n"
        )
        _mark(out, spec["shards"])
    return out


def energon_loader(spec: dict[str, Any]) -> Any:
    from megatron.energon import DefaultTaskEncoder, WorkerConfig, get_loader, get_train_dataset

    work = DecodeCrop(spec["size"])

    class Encoder(DefaultTaskEncoder):
        decoder = None  # the raw bytes: the same torchvision decode as the other loaders, below

        def encode_sample(self, sample: Any) -> Any:
            return work({"jpg": sample.image, "cls": sample.label})

        def batch(self, samples: list[Any]) -> Any:
            return torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples])

        def encode_batch(self, batch: Any) -> Any:
            return batch

    config = WorkerConfig(rank=0, world_size=1, num_workers=spec["workers"])
    ds = get_train_dataset(
        str(_energon_dir(spec)), worker_config=config, batch_size=spec["batch"], shuffle_buffer_size=spec["buffer"],
        max_samples_per_sequence=100, task_encoder=Encoder(),
    )
    return _Epochs(get_loader(ds), -(-spec["samples"] // spec["batch"]))


def dali_loader(spec: dict[str, Any]) -> Any:
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.base_iterator import LastBatchPolicy
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    size = spec["size"]

    @pipeline_def(batch_size=spec["batch"], num_threads=max(1, spec["workers"]), device_id=None, seed=0)
    def pipeline() -> Any:
        jpegs, labels = fn.readers.webdataset(
            paths=spec["shards"], ext=["jpg", "cls"], random_shuffle=True, initial_fill=spec["buffer"],
            name="reader",
        )
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=size, resize_y=size)
        images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW",
                                          mirror=fn.random.coin_flip())
        return images, labels

    pipe = pipeline()
    pipe.build()
    os.environ.setdefault("DALI_DISABLE_NVML", "1")
    return DALIGenericIterator([pipe], ["jpg", "cls"], reader_name="reader", auto_reset=True,
                               last_batch_policy=LastBatchPolicy.PARTIAL)
