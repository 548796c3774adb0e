"""CDL: yearly crop masks in CONUS Albers, nearest resampling, TorchGeo's ordinal labels, years and colours."""

from __future__ import annotations

import functools
import hashlib
import http.server
import pickle
import threading
import zipfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
from affine import Affine
from rasterio.enums import Resampling
from rasterio.warp import reproject

from pipekit.datasets import CDL, CDL_CLASSES
from pipekit.errors import ArchiveError, DatasetNotFoundError, HashError, ReadError
from pipekit.geo import BoundingBox

# CONUS Albers coordinates in central Iowa
AX, AY = 150_000.0, 2_100_000.0
CLASSES = np.array([1, 5, 24, 36, 111, 121, 176, 254], dtype=np.uint8)
# TorchGeo 0.8's ordinal labels of these codes (their positions in its CDL.cmap): facts, not computed here
TORCHGEO_LABELS = {0: 0, 1: 1, 5: 5, 24: 15, 36: 27, 61: 51, 62: 0, 111: 72, 121: 74, 122: 75, 141: 79, 176: 83,
                   254: 133, 255: 0}


def ordinal(codes: np.ndarray) -> np.ndarray:
    """TorchGeo's ordinal labels of ``codes`` (every code used in these tests is in TORCHGEO_LABELS)."""
    return np.vectorize(TORCHGEO_LABELS.__getitem__, otypes=[np.int64])(codes)


def write(path: Path, array: np.ndarray, crs: str, transform: Affine, nodata: float | None = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with rasterio.open(path, "w", driver="GTiff", width=array.shape[-1], height=array.shape[-2], count=1,
                       dtype=array.dtype.name, crs=crs, transform=transform, nodata=nodata, tiled=True,
                       blockxsize=128, blockysize=128, compress="deflate") as f:
        f.write(array, 1)
    return path


def cdl_values(height: int = 300, width: int = 300, shift: int = 0) -> np.ndarray:
    yy, xx = np.mgrid[0:height, 0:width]
    return CLASSES[((xx + shift) // 23 + yy // 31) % len(CLASSES)]


ALBERS = Affine(30.0, 0.0, AX, 0.0, -30.0, AY)


@pytest.fixture(scope="module")
def cdl_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cdl")
    write(root / "2021_30m_cdls.tif", cdl_values(), "EPSG:5070", ALBERS)
    write(root / "2022_30m_cdls.tif", cdl_values(shift=11), "EPSG:5070", ALBERS)
    (root / "2021_30m_cdls.tif.aux.xml").write_text("<PAMDataset/>")
    (root / "2021_30m_cdls.zip").write_bytes(b"PK")  # not a zip: never opened while the year's .tif is there
    return root


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    from pipekit.synthetic.geo import write_landsat_cdl_corpus

    return write_landsat_cdl_corpus(tmp_path_factory.mktemp("corpus"), size=128, scenes=1, progress=False)


def albers_box(col: int, row: int, size: int) -> BoundingBox:
    return BoundingBox(AX + col * 30, AX + (col + size) * 30, AY - (row + size) * 30, AY - row * 30)


def year(y: int) -> float:
    return datetime(y, 1, 1, tzinfo=timezone.utc).timestamp()


def zip_of(tif: Path, dest: Path) -> Path:
    """``dest``: a real zip holding ``tif`` (and a world file, as USDA's zips do)."""
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.write(tif, tif.name)
        z.writestr(tif.stem + ".tfw", "30\n0\n0\n-30\n150015\n2099985\n")
    return dest


class TestOrdinalLabels:
    def test_masks_hold_torchgeos_ordinal_labels(self, cdl_root):
        ds = CDL(cdl_root)
        assert len(ds) == 2 and ds.crs.to_epsg() == 5070 and ds.res == (30.0, 30.0)
        sample = ds[albers_box(10, 20, 64).with_time(year(2021), year(2021) + 86400)]
        mask = sample["mask"]
        assert mask.dtype == torch.int64 and mask.shape == (64, 64)
        np.testing.assert_array_equal(mask.numpy(), ordinal(cdl_values()[20:84, 10:74]))
        assert {15, 27, 72, 74} <= set(torch.unique(mask).tolist())  # not the codes 24, 36, 111, 121
        later = ds[albers_box(10, 20, 64).with_time(year(2022), year(2022) + 86400)]["mask"]
        np.testing.assert_array_equal(later.numpy(), ordinal(cdl_values(shift=11)[20:84, 10:74]))
        assert ds.resampling == Resampling.nearest and not ds.is_image

    def test_ordinal_false_keeps_the_raw_codes(self, cdl_root):
        ds = CDL(cdl_root, ordinal=False)
        mask = ds[albers_box(10, 20, 64).with_time(year(2021), year(2021))]["mask"]
        assert mask.dtype == torch.int64
        np.testing.assert_array_equal(mask.numpy(), cdl_values()[20:84, 10:74])
        assert ds.class_names[24] == "Winter Wheat" and ds.labels_of([24, 176]) == [24, 176]
        with pytest.raises(ValueError, match="pass one or the other"):
            CDL(cdl_root, classes=[0, 1], ordinal=False)
        with pytest.raises(TypeError, match="ordinal must be a bool"):
            CDL(cdl_root, ordinal="no")

    def test_codes_outside_the_colour_table_become_background(self, tmp_path):
        codes = np.array([[62, 255, 1, 0], [24, 122, 141, 254]], dtype=np.uint8)
        write(tmp_path / "2023_30m_cdls.tif", codes, "EPSG:5070", ALBERS, nodata=None)
        ds = CDL(tmp_path)
        mask = ds[ds.bounds]["mask"].numpy()
        np.testing.assert_array_equal(mask, ordinal(codes))
        assert mask.tolist() == [[0, 0, 1, 0], [15, 75, 79, 133]]

    def test_nearest_when_reprojected_then_mapped(self, cdl_root):
        ds = CDL(cdl_root, crs="EPSG:32615", res=30)
        b = ds.bounds
        q = BoundingBox(b.minx + 1500, b.minx + 1500 + 100 * 30, b.miny + 1500, b.miny + 1500 + 100 * 30)
        mask = ds[q.with_time(year(2021) + 1, year(2021) + 1)]["mask"].numpy()
        grid = ds.grid(q)
        expected = np.zeros((grid.height, grid.width), np.uint8)
        with rasterio.open(cdl_root / "2021_30m_cdls.tif") as src:
            reproject(rasterio.band(src, 1), expected, dst_transform=grid.transform, dst_crs=grid.crs,
                      resampling=Resampling.nearest)
        assert set(np.unique(mask).tolist()) <= set(ordinal(CLASSES).tolist()) | {0}
        assert (mask == ordinal(expected)).mean() >= 0.99

    def test_the_warp_cache_keeps_raw_codes(self, cdl_root):
        """Datasets of one file with different labels, reprojected (so through the warp cache), in turn."""
        q = None
        results = {}
        for name, kwargs in [("all", {}), ("some", {"classes": [0, 24, 176]}), ("raw", {"ordinal": False}),
                             ("all again", {})]:
            ds = CDL(cdl_root, crs="EPSG:32615", res=30, **kwargs)
            if q is None:
                b = ds.bounds
                q = BoundingBox(b.minx + 900, b.minx + 900 + 80 * 30, b.miny + 900, b.miny + 900 + 80 * 30,
                                year(2021) + 1, year(2021) + 1)
            results[name] = ds[q]["mask"]
        raw = results["raw"].numpy()
        assert set(np.unique(raw).tolist()) <= set(CLASSES.tolist()) | {0}
        np.testing.assert_array_equal(results["all"].numpy(), ordinal(raw))
        np.testing.assert_array_equal(results["all again"].numpy(), ordinal(raw))
        np.testing.assert_array_equal(results["some"].numpy(), np.select([raw == 24, raw == 176], [1, 2], 0))

    def test_transforms_see_the_labels(self, cdl_root):
        seen = []

        def record(sample):
            seen.append(sample["mask"].clone())
            return sample

        ds = CDL(cdl_root, classes=[0, 24], transforms=record)
        out = ds[albers_box(0, 0, 50).with_time(year(2021), year(2021))]["mask"]
        assert torch.equal(seen[0], out) and set(torch.unique(out).tolist()) == {0, 1}

    def test_paths_or_root(self, cdl_root):
        assert len(CDL(paths=cdl_root)) == len(CDL(root=str(cdl_root))) == 2
        with pytest.raises(TypeError, match="not both"):
            CDL(cdl_root, root=cdl_root)

    def test_pickled_dataset_keeps_its_classes(self, cdl_root):
        ds = CDL(cdl_root, classes=[0, 1, 5, 176])
        clone = pickle.loads(pickle.dumps(ds))
        box = albers_box(0, 0, 120).with_time(year(2021), year(2021))
        assert torch.equal(clone[box]["mask"], ds[box]["mask"])
        assert clone.classes == [0, 1, 5, 176] and torch.equal(clone.ordinal_map, ds.ordinal_map)


class TestRelabel:
    """The two-codes-per-gather lookup gives ``lookup[codes]`` exactly, whatever the array's shape or layout."""

    @pytest.mark.parametrize("shape", [(1, 256, 256), (1, 255, 255), (1, 1, 1), (1, 3, 5), (1, 0, 4), (2, 7, 8)])
    def test_same_as_one_gather_per_code(self, shape):
        from pipekit.datasets._cdl import _pair_table, _relabel

        rng = np.random.default_rng(sum(shape))
        lookup = rng.integers(0, 134, 256).astype(np.uint8)
        codes = rng.integers(0, 256, shape, dtype=np.uint8)
        got = _relabel(codes, lookup, _pair_table(lookup))
        assert got.dtype == np.uint8 and got.shape == codes.shape
        np.testing.assert_array_equal(got, lookup[codes])
        strided = rng.integers(0, 256, (1, 16, 32), dtype=np.uint8)[:, :, ::2]  # not C-contiguous
        np.testing.assert_array_equal(_relabel(strided, lookup, _pair_table(lookup)), lookup[strided])

    @pytest.mark.parametrize("dtype", [None, "native", torch.float32])
    def test_every_code_in_odd_and_even_patches(self, tmp_path, dtype):
        """All 256 codes (nodata 0 and codes outside the colour table included), patches of odd and even widths."""
        codes = np.arange(256 * 3, dtype=np.int64).reshape(16, 48).astype(np.uint8)
        write(tmp_path / "2023_30m_cdls.tif", codes, "EPSG:5070", ALBERS, nodata=0)
        ds = CDL(tmp_path, dtype=dtype)
        want_dtype = {None: torch.int64, "native": torch.uint8}.get(dtype, dtype)
        labels = np.zeros(256, dtype=np.int64)  # the public code -> label map; 255 is not a CDL code: 0
        labels[: len(ds.ordinal_map)] = ds.ordinal_map.numpy()
        assert labels[24] == 15 and labels[254] == 133 and labels[62] == 0
        for col, row, w, h in ((0, 0, 48, 16), (1, 2, 7, 5), (3, 1, 10, 9)):
            mask = ds[BoundingBox(AX + col * 30, AX + (col + w) * 30, AY - (row + h) * 30, AY - row * 30)]["mask"]
            assert mask.dtype == want_dtype and mask.shape == (h, w)
            want = labels[codes[row:row + h, col:col + w]]
            np.testing.assert_array_equal(mask.numpy(), want)


class TestClasses:
    def test_subset_maps_every_other_code_to_background(self, cdl_root):
        ds = CDL(cdl_root, classes=[0, 1, 5, 176])
        box = albers_box(0, 0, 200).with_time(year(2021), year(2021))
        mask = ds[box]["mask"].numpy()
        raw = CDL(cdl_root, ordinal=False)[box]["mask"].numpy()
        assert set(np.unique(mask).tolist()) == {0, 1, 2, 3}
        assert ((mask == 1) == (raw == 1)).all()
        assert ((mask == 2) == (raw == 5)).all()
        assert ((mask == 3) == (raw == 176)).all()
        assert ((mask == 0) == ~np.isin(raw, [1, 5, 176])).all()
        assert ds.classes == [0, 1, 5, 176]
        assert ds.class_names == {0: "Background", 1: "Corn", 2: "Soybeans", 3: "Grass/Pasture"}
        assert ds.labels_of([176, 1]) == [3, 1]
        with pytest.raises(ValueError, match=r"CDL code\(s\) \[24\] are not among the dataset's classes"):
            ds.labels_of([0, 24])

    def test_ordinal_map_and_colour_map_as_torchgeo_builds_them(self, cdl_root):
        ds = CDL(cdl_root, classes=[0, 24, 1])
        assert ds.ordinal_map.dtype == torch.int64 and ds.ordinal_map.shape == (255,)
        assert ds.ordinal_map[24] == 1 and ds.ordinal_map[1] == 2 and ds.ordinal_map[5] == 0
        assert int(ds.ordinal_map.count_nonzero()) == 2
        assert ds.ordinal_cmap.dtype == torch.uint8
        assert ds.ordinal_cmap.tolist() == [list(CDL.cmap[0]), list(CDL.cmap[24]), list(CDL.cmap[1])]
        full = CDL(cdl_root)
        assert full.classes == list(CDL.cmap) and full.ordinal_cmap.shape == (134, 4)
        assert {code: int(full.ordinal_map[code]) for code in TORCHGEO_LABELS if code < 255} == {
            k: v for k, v in TORCHGEO_LABELS.items() if k < 255}

    def test_validation_as_torchgeo(self, cdl_root):
        with pytest.raises(ValueError, match="Classes must include the background class: 0"):
            CDL(cdl_root, classes=[1, 5])
        with pytest.raises(ValueError, match=r"\[62, 300\] are not CDL class codes\. Only the following classes"):
            CDL(cdl_root, classes=[0, 62, 300])
        # pipekit refuses what TorchGeo would accept and get wrong
        with pytest.raises(ValueError, match="must start with 0"):
            CDL(cdl_root, classes=[1, 0, 5])
        with pytest.raises(ValueError, match="must not repeat"):
            CDL(cdl_root, classes=[0, 1, 1])
        with pytest.raises(TypeError, match="list of CDL class codes"):
            CDL(cdl_root, classes="corn")
        with pytest.raises(TypeError, match=r"\(ints\)"):
            CDL(cdl_root, classes=[0, 1.0])

    def test_colour_map_facts(self):
        assert len(CDL.cmap) == 134 and len(CDL_CLASSES) == 134 and 62 not in CDL.cmap
        assert CDL.cmap[0] == (0, 0, 0, 255)
        assert CDL.cmap[1] == (255, 211, 0, 255)  # corn: yellow
        assert CDL.cmap[5] == (37, 111, 0, 255)  # soybeans: green
        assert CDL.cmap[111] == (73, 111, 162, 255)  # open water
        assert list(CDL.cmap) == sorted(CDL.cmap)
        assert CDL.class_names[24] == "Winter Wheat"
        assert all(len(rgb) == 3 for _, rgb in CDL_CLASSES.values())


class TestYears:
    def test_default_uses_every_year_found(self, cdl_root):
        ds = CDL(cdl_root)
        assert ds.years == [2023] and len(ds) == 2

    def test_years_select_files_by_the_year_in_their_name(self, cdl_root):
        ds = CDL(cdl_root, years=[2022])
        assert ds.years == [2022] and len(ds) == 1 and ds.files[0].endswith("2022_30m_cdls.tif")
        with pytest.raises(IndexError):
            ds[albers_box(0, 0, 10).with_time(year(2021), year(2021))]
        assert len(CDL(cdl_root, years=[2021, 2022])) == 2

    def test_a_year_cdl_does_not_have(self, cdl_root):
        with pytest.raises(ValueError, match=r"CDL has no year\(s\) \[2007\]: CDL data product only exists for the "
                                             r"following years: \[2024, 2023, "):
            CDL(cdl_root, years=[2007, 2021])
        with pytest.raises(TypeError, match="years must be a list"):
            CDL(cdl_root, years=2021)
        with pytest.raises(ValueError, match="years must not be empty"):
            CDL(cdl_root, years=[])

    def test_a_year_without_a_file(self, cdl_root):
        with pytest.raises(FileNotFoundError, match=r"no file for year\(s\) \[2023\] .* nor 2023_30m_cdls.zip to "
                                                    r"extract; pass download=True"):
            CDL(cdl_root, years=[2021, 2023])
        with pytest.raises(FileNotFoundError, match=r"no file for year\(s\) \[2019, 2020\]"):
            CDL(cdl_root, years=[2020, 2019])

    def test_nothing_there(self, tmp_path):
        # TorchGeo's DatasetNotFoundError, still a FileNotFoundError (what pipekit raised before)
        with pytest.raises(DatasetNotFoundError, match=r"Dataset not found: .*no file for year\(s\) \[2023\] "
                                                       r".* in '.*nothing'"):
            CDL(tmp_path / "nothing")
        (tmp_path / "empty").mkdir()
        with pytest.raises(DatasetNotFoundError, match="pass download=True"):
            CDL(tmp_path / "empty")


class TestZipsAndDownload:
    @pytest.fixture
    def tif_2021(self, tmp_path) -> Path:
        return write(tmp_path / "src" / "2021_30m_cdls.tif", cdl_values(64, 64), "EPSG:5070", ALBERS)

    def test_zip_of_the_year_is_extracted(self, tmp_path, tif_2021):
        root = tmp_path / "data"
        root.mkdir()
        zip_of(tif_2021, root / "2021_30m_cdls.zip")
        ds = CDL(root, years=[2021])
        assert (root / "2021_30m_cdls.tif").is_file() and len(ds) == 1
        np.testing.assert_array_equal(ds[ds.bounds]["mask"].numpy(), ordinal(cdl_values(64, 64)))

    def test_a_corrupt_zip(self, tmp_path):
        (tmp_path / "2023_30m_cdls.zip").write_bytes(b"PK not a zip")
        with pytest.raises(ArchiveError, match=r"cannot extract '.*2023_30m_cdls.zip' in CDL"):
            CDL(tmp_path)

    @pytest.fixture
    def server(self, tmp_path, tif_2021, monkeypatch) -> Iterator[tuple[str, str]]:
        served = tmp_path / "served"
        served.mkdir()
        digest = hashlib.md5(zip_of(tif_2021, served / "2021_30m_cdls.zip").read_bytes()).hexdigest()

        class Quiet(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(served)))
        thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        thread.start()
        monkeypatch.setenv("no_proxy", "127.0.0.1")
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        monkeypatch.setattr(CDL, "url", base + "/{}_30m_cdls.zip")
        try:
            yield base, digest
        finally:
            httpd.shutdown()
            httpd.server_close()

    def test_download_and_checksum(self, tmp_path, server, monkeypatch):
        _, digest = server
        monkeypatch.setitem(CDL.md5s, 2021, digest)
        root = tmp_path / "new" / "cdl"
        with pytest.raises(FileNotFoundError, match="pass download=True"):
            CDL(root, years=[2021])
        ds = CDL(root, years=[2021], download=True, checksum=True)
        assert len(ds) == 1 and (root / "2021_30m_cdls.zip").is_file() and (root / "2021_30m_cdls.tif").is_file()
        np.testing.assert_array_equal(ds[ds.bounds]["mask"].numpy(), ordinal(cdl_values(64, 64)))
        # the files are there now: nothing is downloaded again
        assert len(CDL(root, years=[2021], download=True)) == 1

    def test_wrong_checksum(self, tmp_path, server, monkeypatch):
        monkeypatch.setitem(CDL.md5s, 2021, "0" * 32)
        root = tmp_path / "bad"
        with pytest.raises(HashError, match=r"cannot check the MD5 of 'http://127.0.0.1:\d+/2021_30m_cdls.zip' in "
                                            "CDL: expected MD5 0{32}, got") as info:
            CDL(root, years=[2021], download=True, checksum=True)
        assert info.value.expected == "0" * 32 and len(info.value.actual) == 32
        assert list(root.iterdir()) == []  # nothing half-written left behind

    def test_download_error_names_the_url(self, tmp_path, server):
        with pytest.raises(ReadError, match=r"cannot download 'http://127.0.0.1:\d+/2022_30m_cdls.zip' in CDL"):
            CDL(tmp_path / "d", years=[2022], download=True)


class TestPlot:
    def test_plot_uses_the_ordinal_colour_map_and_names(self, cdl_root, tmp_path):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ds = CDL(cdl_root)
        sample = ds[albers_box(0, 0, 100).with_time(year(2021), year(2021))]
        fig = ds.plot(sample)
        fig.savefig(tmp_path / "cdl.png")
        plt.close(fig)
        labels = [t.get_text() for t in fig.get_axes()[0].get_legend().get_texts()]
        assert "1: Corn" in labels and "72: Open Water" in labels and "15: Winter Wheat" in labels
        image = fig.get_axes()[0].get_images()[0].get_array()
        for code in (1, 24, 111):
            pixel = np.argwhere(sample["mask"].numpy() == TORCHGEO_LABELS[code])[0]
            np.testing.assert_allclose(image[pixel[0], pixel[1]], np.array(CDL.cmap[code]) / 255)

    def test_prediction_beside_the_mask(self, cdl_root):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ds = CDL(cdl_root, classes=[0, 24, 176])
        sample = ds[albers_box(0, 0, 60).with_time(year(2021), year(2021))]
        prediction = torch.full_like(sample["mask"], 2)  # grass everywhere
        fig = ds.plot({**sample, "prediction": prediction}, suptitle="2021")
        plt.close(fig)
        mask_ax, prediction_ax = fig.get_axes()
        assert [mask_ax.get_title(), prediction_ax.get_title()] == ["Mask", "Prediction"]
        np.testing.assert_allclose(prediction_ax.get_images()[0].get_array()[0, 0], np.array(CDL.cmap[176]) / 255)

    def test_raw_codes_plot_with_the_code_colours(self, cdl_root):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ds = CDL(cdl_root, ordinal=False)
        sample = ds[albers_box(0, 0, 100).with_time(year(2021), year(2021))]
        fig = ds.plot(sample)
        plt.close(fig)
        labels = [t.get_text() for t in fig.get_axes()[0].get_legend().get_texts()]
        assert "24: Winter Wheat" in labels and "111: Open Water" in labels


class TestSyntheticCorpus:
    def test_masks_are_torchgeos_mapping_of_the_codes(self, corpus):
        from pipekit.synthetic.geo import CDL_CLASSES as SYNTHETIC

        ds, raw_ds = CDL(corpus / "cdl"), CDL(corpus / "cdl", ordinal=False)
        b = ds.bounds
        box = BoundingBox(b.minx + 300, b.minx + 300 + 100 * 30, b.miny + 300, b.miny + 300 + 100 * 30)
        mask, raw = ds[box]["mask"].numpy(), raw_ds[box]["mask"].numpy()
        with rasterio.open(corpus / "cdl" / "2023_30m_cdls.tif") as src:
            window = src.window(box.minx, box.miny, box.maxx, box.maxy)
            np.testing.assert_array_equal(raw, src.read(1, window=window))
        assert set(np.unique(raw).tolist()) <= set(SYNTHETIC) and len(np.unique(raw)) >= 4
        np.testing.assert_array_equal(mask, ordinal(raw))
        subset = CDL(corpus / "cdl", classes=[0, 5, 141])[box]["mask"].numpy()
        np.testing.assert_array_equal(subset, np.select([raw == 5, raw == 141], [1, 2], 0))


@pytest.fixture(scope="module")
def tg():
    return pytest.importorskip("torchgeo.datasets")


class TestSideBySideWithTorchGeo:
    """The same CDL file through TorchGeo 0.8's CDL and pipekit's, over the same bounds on the native grid."""

    def window(self, ds_tg, cols: int, rows: int, offset: int = 10) -> tuple[slice, slice]:
        xs, ys, _ = ds_tg.bounds
        x0, y0 = float(xs.start) + 30 * offset, float(ys.start) + 30 * offset
        return slice(x0, x0 + 30 * cols), slice(y0, y0 + 30 * rows)

    @pytest.mark.parametrize("classes", [None, [0, 1, 5, 24, 176], [0, 141, 122, 111]])
    def test_same_labels(self, tg, corpus, classes):
        extra = {} if classes is None else {"classes": classes}
        theirs = tg.CDL(paths=str(corpus / "cdl"), years=[2023], **extra)
        ours = CDL(paths=str(corpus / "cdl"), years=[2023], **extra)
        assert ours.classes == theirs.classes
        assert torch.equal(ours.ordinal_map, theirs.ordinal_map)
        assert torch.equal(ours.ordinal_cmap, theirs.ordinal_cmap)
        xs, ys = self.window(theirs, 120, 100)
        a, b = theirs[xs, ys]["mask"], ours[xs, ys]["mask"]
        assert a.dtype == b.dtype == torch.int64 and a.shape == b.shape == (100, 120)
        assert set(torch.unique(a).tolist()) == set(torch.unique(b).tolist())
        assert len(torch.unique(b)) >= (3 if classes is None else 2)
        assert torch.equal(a, b)

    def test_same_colour_map(self, tg):
        assert CDL.cmap == tg.CDL.cmap
        assert list(CDL.md5s) == list(tg.CDL.md5s) and CDL.url == tg.CDL.url
