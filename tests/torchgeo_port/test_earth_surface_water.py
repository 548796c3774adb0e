"""TorchGeo 0.8's "Earth Surface Water" tutorial (docs/tutorials/earth_surface_water.ipynb), ported by its imports.

Its dataset, sampler, data loader, batch plotting and normalisation cells, in
order, as the tutorial has them; the only changes are the imports
(``torchgeo`` -> ``pipekit``) and the paths: the download cell is replaced by
the session's synthetic copy of the dataset's ``dset-s2`` folders
(``conftest.py``).  The model and training cells are not data loading and
are left out.
"""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
import torch


@pytest.fixture
def tempdir(tutorial_data, tmp_path, monkeypatch):
    shutil.copytree(tutorial_data["surface_water"], tmp_path / "surface_water")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    return tmp_path


def tutorial_datasets_and_loaders():
    """The tutorial's cells up to the batch plot; returns its variables for the checks and the next cells."""
    # -- Imports (torchgeo -> pipekit; kornia and sklearn are imported by the cells that use them)
    import tempfile
    from collections.abc import Iterable
    from pathlib import Path

    import matplotlib.pyplot as plt
    import torch
    from torch.utils.data import DataLoader

    from pipekit.datasets import RasterDataset, stack_samples, unbind_samples, utils  # noqa: F401
    from pipekit.samplers import RandomGeoSampler, Units

    # -- Download and extract dataset to a temp folder (the download replaced by the fixture's files)
    tmp_path = Path(tempfile.gettempdir()) / "surface_water/"

    # Set the root to the extracted folder
    root = tmp_path / "dset-s2"

    # -- Creating the Datasets
    def scale(item: dict):
        item["image"] = item["image"] / 10000
        return item

    train_imgs = RasterDataset(
        paths=(root / "tra_scene").as_posix(), crs="epsg:3395", res=10, transforms=scale
    )
    train_msks = RasterDataset(
        paths=(root / "tra_truth").as_posix(), crs="epsg:3395", res=10
    )

    valid_imgs = RasterDataset(
        paths=(root / "val_scene").as_posix(), crs="epsg:3395", res=10, transforms=scale
    )
    valid_msks = RasterDataset(
        paths=(root / "val_truth").as_posix(), crs="epsg:3395", res=10
    )

    # IMPORTANT
    train_msks.is_image = False
    valid_msks.is_image = False

    train_dset = train_imgs & train_msks
    valid_dset = valid_imgs & valid_msks

    # Create the samplers

    train_sampler = RandomGeoSampler(train_imgs, size=512, length=130, units=Units.PIXELS)
    valid_sampler = RandomGeoSampler(valid_imgs, size=512, length=64, units=Units.PIXELS)

    # -- Understanding the sampler
    bbox = next(iter(train_sampler))
    bbox

    sample = train_dset[bbox]
    sample.keys()

    sample["image"].shape, sample["mask"].shape

    # -- Creating Dataloaders
    # Adjust the batch size according to your GPU memory
    train_dataloader = DataLoader(
        train_dset, sampler=train_sampler, batch_size=4, collate_fn=stack_samples
    )
    valid_dataloader = DataLoader(
        valid_dset, sampler=valid_sampler, batch_size=4, collate_fn=stack_samples
    )

    train_batch = next(iter(train_dataloader))
    valid_batch = next(iter(valid_dataloader))
    train_batch.keys(), valid_batch.keys()

    # -- Batch Visualization
    def plot_imgs(
        images: Iterable, axs: Iterable, chnls: list[int] = [2, 1, 0], bright: float = 3.0  # noqa: B006
    ):
        for img, ax in zip(images, axs):
            arr = torch.clamp(bright * img, min=0, max=1).numpy()
            rgb = arr.transpose(1, 2, 0)[:, :, chnls]
            ax.imshow(rgb)
            ax.axis("off")

    def plot_msks(masks: Iterable, axs: Iterable):
        for mask, ax in zip(masks, axs):
            ax.imshow(mask.squeeze().numpy(), cmap="Blues")
            ax.axis("off")

    def plot_batch(
        batch: dict,
        bright: float = 3.0,
        cols: int = 4,
        width: int = 5,
        chnls: list[int] = [2, 1, 0],  # noqa: B006
    ):
        # Get the samples and the number of items in the batch
        samples = unbind_samples(batch.copy())

        # if batch contains images and masks, the number of images will be doubled
        n = 2 * len(samples) if ("image" in batch) and ("mask" in batch) else len(samples)

        # calculate the number of rows in the grid
        rows = n // cols + (1 if n % cols != 0 else 0)

        # create a grid
        _, axs = plt.subplots(rows, cols, figsize=(cols * width, rows * width))

        if ("image" in batch) and ("mask" in batch):
            # plot the images on the even axis
            plot_imgs(
                images=map(lambda x: x["image"], samples),
                axs=axs.reshape(-1)[::2],
                chnls=chnls,
                bright=bright,
            )

            # plot the masks on the odd axis
            plot_msks(masks=map(lambda x: x["mask"], samples), axs=axs.reshape(-1)[1::2])

        else:
            if "image" in batch:
                plot_imgs(
                    images=map(lambda x: x["image"], samples),
                    axs=axs.reshape(-1),
                    chnls=chnls,
                    bright=bright,
                )

            elif "mask" in batch:
                plot_msks(masks=map(lambda x: x["mask"], samples), axs=axs.reshape(-1))

    plot_batch(train_batch)
    plt.close("all")

    return {"train_imgs": train_imgs, "train_msks": train_msks, "train_dset": train_dset, "valid_dset": valid_dset,
            "train_sampler": train_sampler, "bbox": bbox, "sample": sample, "train_batch": train_batch,
            "valid_batch": valid_batch, "train_dataloader": train_dataloader}


def calc_statistics_cells(train_imgs):
    """The tutorial's statistics cell (reads the files listed by the dataset's GeoDataFrame index)."""
    import numpy as np
    import rasterio as rio

    from pipekit.datasets import RasterDataset

    def calc_statistics(dset: RasterDataset):
        """
        Calculate the statistics (mean and std) for the entire dataset
        Warning: This is an approximation. The correct value should take into account the
        mean for the whole dataset for computing individual stds.
        For correctness I suggest checking: http://notmatthancock.github.io/2017/03/23/simple-batch-stat-updates.html
        """

        # To avoid loading the entire dataset in memory, we will loop through each img
        # The filenames will be retrieved from the dataset's GeoDataFrame index
        files = dset.index.filepath

        # Resetting statistics
        accum_mean = 0
        accum_std = 0

        for file in files:
            img = rio.open(file).read() / 10000
            accum_mean += img.reshape((img.shape[0], -1)).mean(axis=1)
            accum_std += img.reshape((img.shape[0], -1)).std(axis=1)

        # at the end, we shall have 2 vectors with length n=chnls
        # we will average them considering the number of images
        return accum_mean / len(files), accum_std / len(files)

    # Calculate the statistics (Mean and std) for the dataset
    mean, std = calc_statistics(train_imgs)

    # Please, note that we will create spectral indices using the raw (non-normalized) data. Then, when normalizing,
    # the sensors will have more channels (the indices) that should not be normalized.
    # To solve this, we will add the indices to the 0's to the mean vector and 1's to the std vectors
    mean = np.concat([mean, [0, 0, 0]])
    std = np.concat([std, [1, 1, 1]])
    return mean, std


def test_datasets_samplers_and_loaders(tempdir):
    out = tutorial_datasets_and_loaders()
    sample, batch = out["sample"], out["train_batch"]
    # the sampler's query: TorchGeo 0.8's (slice x, slice y, slice t), 512 px of 10 m in World Mercator
    x, y, t = out["bbox"]
    assert isinstance(t.start, pd.Timestamp)
    assert (x.stop - x.start, y.stop - y.start) == (5120, 5120)
    assert sorted(sample.keys()) == ["bounds", "crs", "image", "mask", "transform"]
    assert sample["image"].shape == (6, 512, 512) and sample["image"].dtype == torch.float32
    # `train_msks.is_image = False` after construction: int64 masks, read with nearest neighbours
    assert sample["mask"].shape == (512, 512) and sample["mask"].dtype == torch.int64
    assert set(sample["mask"].unique().tolist()) <= {0, 1}
    assert float(sample["image"].max()) < 1.0  # scale() ran on the images
    assert batch["image"].shape == (4, 6, 512, 512) and batch["mask"].shape == (4, 512, 512)
    assert out["valid_batch"]["image"].shape == (4, 6, 512, 512)
    assert out["train_imgs"].crs.to_epsg() == 3395 and len(out["train_imgs"]) == 2
    water = sum(int(out["train_dset"][q]["mask"].sum()) for q in list(out["train_sampler"])[:16])
    assert water > 0  # the synthetic river is in the masks


def test_normalisation(tempdir):
    out = tutorial_datasets_and_loaders()
    mean, std = calc_statistics_cells(out["train_imgs"])
    assert mean.shape == (9,) and std.shape == (9,)
    assert list(mean[6:]) == [0, 0, 0] and list(std[6:]) == [1, 1, 1]
    assert (mean[:6] > 0).all() and (mean[:6] < 1).all()

    # -- the tutorial's transforms cell (kornia, and pipekit.transforms.indices as torchgeo.transforms.indices)
    K = pytest.importorskip("kornia.augmentation", reason="the tutorial normalises with kornia")  # noqa: N806
    from pipekit.transforms import indices

    train_batch = out["train_batch"]

    norm = K.Normalize(mean=mean, std=std)

    tfms = torch.nn.Sequential(
        indices.AppendNDWI(index_green=1, index_nir=3),
        indices.AppendNDWI(index_green=1, index_nir=5),
        indices.AppendNDVI(index_nir=3, index_red=2),
        norm,
    )

    transformed_img = tfms(train_batch["image"])
    print(transformed_img.shape)
    assert transformed_img.shape == (4, 9, 512, 512)
