"""TorchGeo 0.8's "Custom Raster Datasets" tutorial (docs/tutorials/custom_raster_dataset.ipynb), ported by its imports.

The tutorial's cells, in order, as the tutorial has them; the only changes
are the imports (``torchgeo`` -> ``pipekit``) and the paths: the Planetary
Computer download cell is replaced by the session's synthetic Sentinel-2
files, named as the Planetary Computer serves them (``conftest.py``), and
the ``Downloadable`` example class is left out (it only shows a signature).
"""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture
def tempdir(tutorial_data, tmp_path, monkeypatch):
    shutil.copytree(tutorial_data["sentinel"], tmp_path / "sentinel")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    return tmp_path


def test_custom_raster_dataset(tempdir):
    # -- Imports (torchgeo -> pipekit; planetary_computer and pystac are only used by the download)
    import os
    import tempfile

    import matplotlib.pyplot as plt
    import torch
    from torch.utils.data import DataLoader

    from pipekit.datasets import RasterDataset, stack_samples, unbind_samples
    from pipekit.samplers import RandomGeoSampler

    plt.rcParams["figure.figsize"] = (12, 12)

    # -- Downloading (replaced by the fixture's files)
    root = os.path.join(tempfile.gettempdir(), "sentinel")

    # This downloads the following files:
    sorted(os.listdir(root))

    # -- Defining a dataset
    class Sentinel2(RasterDataset):
        filename_glob = "T*_B02_10m.tif"
        filename_regex = r"^.{6}_(?P<date>\d{8}T\d{6})_(?P<band>B0[\d])"
        date_format = "%Y%m%dT%H%M%S"
        is_image = True
        separate_files = True
        all_bands = ("B02", "B03", "B04", "B08")
        rgb_bands = ("B04", "B03", "B02")

    dataset = Sentinel2(root)
    print(dataset)

    # -- Plotting
    class Sentinel2(RasterDataset):
        filename_glob = "T*_B02_10m.tif"
        filename_regex = r"^.{6}_(?P<date>\d{8}T\d{6})_(?P<band>B0[\d])"
        date_format = "%Y%m%dT%H%M%S"
        is_image = True
        separate_files = True
        all_bands = ("B02", "B03", "B04", "B08")
        rgb_bands = ("B04", "B03", "B02")

        def plot(self, sample):
            # Find the correct band index order
            rgb_indices = []
            for band in self.rgb_bands:
                rgb_indices.append(self.all_bands.index(band))

            # Reorder and rescale the image
            image = sample["image"][rgb_indices].permute(1, 2, 0)
            image = torch.clamp(image / 10000, min=0, max=1).numpy()

            # Plot the image
            fig, ax = plt.subplots()
            ax.imshow(image)

            return fig

    torch.manual_seed(1)

    dataset = Sentinel2(root)
    sampler = RandomGeoSampler(dataset, size=4096, length=3)
    dataloader = DataLoader(dataset, sampler=sampler, collate_fn=stack_samples)

    seen = []
    for batch in dataloader:
        sample = unbind_samples(batch)[0]
        dataset.plot(sample)
        plt.axis("off")
        plt.show()
        image = sample["image"]  # (added: what the loop saw, checked below)
        seen.append((image.shape, image.dtype, bool((image > 0).all()), sample["bounds"]))

    # ---- what the tutorial shows, checked
    assert sorted(os.listdir(root)) == sorted(
        f"{scene}_{band}_10m.tif"
        for scene in ("T40XDH_20220902T090559", "T40XEJ_20220718T084609")
        for band in ("B02", "B03", "B04", "B08")
    )
    assert len(dataset) == 2  # "a GeoDataset of size 2 because there are 2 scenes"
    assert dataset.res == (10.0, 10.0) and dataset.crs.to_epsg() == 32640
    assert [os.path.basename(f) for f in dataset.index.filepath] == [
        "T40XDH_20220902T090559_B02_10m.tif", "T40XEJ_20220718T084609_B02_10m.tif"]
    assert len(seen) == 3
    for shape, dtype, all_valid, (x, y, _) in seen:
        assert shape == (4, 4096, 4096) and dtype == torch.float32
        assert all_valid  # every band file of the scene was found and read
        assert x.stop - x.start == 40960 and y.stop - y.start == 40960
    plt.close("all")
