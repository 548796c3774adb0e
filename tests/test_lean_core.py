"""pipekit's core works without the geo extra: none of its packages is imported unless a geo name is used.

The geo extra (``pip install "pipekit[geo]"``) brings rasterio, pyproj, pandas,
shapely, geopandas and pyarrow.  The tests run Python in a subprocess where a
``sys.meta_path`` finder refuses those packages (as if they were not
installed), build and iterate a real image pipeline there, and check that the
geo names fail with an error naming the extra.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipekit import _optional

GEO_PACKAGES = ("rasterio", "pyproj", "pandas", "shapely", "geopandas", "pyarrow")

ROOT = Path(__file__).resolve().parents[1]

# Installed first thing in the subprocess: the geo packages cannot be imported, and every try is recorded.
BLOCKER = textwrap.dedent(
    f"""
    import sys

    BLOCKED = {GEO_PACKAGES!r}
    TRIED = []


    class RefuseGeoPackages:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] not in BLOCKED:
                return None
            # importlib.util.find_spec() probing (torch._dynamo probes pandas, among others, to skip its
            # frames) only looks: let it, as it would find nothing or an unused package; imports are refused.
            if sys._getframe(2).f_code.co_name == "find_spec":
                return None
            TRIED.append(name)
            raise ModuleNotFoundError(f"No module named {{name!r}} (refused by the test)", name=name)


    sys.meta_path.insert(0, RefuseGeoPackages())
    """
)

CORE_PIPELINE = textwrap.dedent(
    """
    import io
    import tarfile
    from pathlib import Path

    import numpy as np
    import torch
    from PIL import Image

    import pipekit
    from pipekit.datasets import ImageFolder, TarShards  # the core recipes import without geo
    from pipekit.pipes import IterableWrapper


    def write_shards(folder):
        rng = np.random.default_rng(0)
        paths = []
        for shard in range(2):
            path = Path(folder) / f"shard-{shard}.tar"
            with tarfile.open(path, "w") as tar:
                for i in range(3):
                    fmt = "png" if i % 2 else "jpg"
                    image = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
                    buffer = io.BytesIO()
                    image.save(buffer, format="PNG" if fmt == "png" else "JPEG")
                    for ext, data in ((fmt, buffer.getvalue()), ("cls", str(shard * 10 + i).encode())):
                        member = tarfile.TarInfo(f"s{shard}-{i}.{ext}")
                        member.size = len(data)
                        tar.addfile(member, io.BytesIO(data))
            paths.append(str(path))
        return paths


    def as_pair(sample):
        image = sample.get(".jpg", sample.get(".png"))
        return list(image.shape), image.dtype == torch.uint8, sample[".cls"]


    def build(paths):
        files = IterableWrapper(paths).sharding_filter().open_files_by_fsspec(mode="rb")
        return files.load_from_tar().webdataset().decode().map(as_pair).batch(2)


    def run(folder):
        paths = write_shards(folder)
        seen = {}
        for workers in (0, 2):
            loader = pipekit.DataLoader(build(paths), num_workers=workers)
            items = [item for batch in loader for item in batch]
            seen[workers] = sorted(items, key=lambda item: item[2])  # the loader hands tuples over as lists
        assert seen[0] == seen[2], seen
        assert [label for _, _, label in seen[0]] == [0, 1, 2, 10, 11, 12], seen[0]
        assert all(shape == [3, 8, 8] and is_uint8 for shape, is_uint8, _ in seen[0]), seen[0]
    """
)


def run_python(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def test_core_pipeline_runs_without_the_geo_packages(tmp_path):
    check = textwrap.dedent(
        """
        import importlib


        def geo_error(get):
            try:
                get()
            except ImportError as exc:
                return str(exc)
            raise AssertionError(f"{get} did not raise ImportError")


        if __name__ == "__main__":
            run(sys.argv[1])
            loaded = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)
            assert TRIED == [] and loaded == [], (TRIED, loaded)
            assert "geo" in dir(pipekit) and "geo" in pipekit.__all__
            import pipekit.datasets
            import pipekit.samplers

            assert "Landsat8" in dir(pipekit.datasets) and "Landsat8" in pipekit.datasets.__all__
            messages = [
                geo_error(lambda: pipekit.geo.RasterDataset),
                geo_error(lambda: importlib.import_module("pipekit.datasets").Landsat8),
                geo_error(lambda: exec("from pipekit.datasets import Landsat8", {})),
                geo_error(lambda: exec("from pipekit.samplers import RandomGeoSampler", {})),
                geo_error(lambda: exec("import pipekit.geo", {})),
                geo_error(lambda: exec("from pipekit.geo.io import RasterOpener", {})),
            ]
            for message in messages:
                assert 'pip install "pipekit[geo]"' in message, message
                assert any(repr(name) in message for name in BLOCKED + ("affine",)), message
            print("ok")
        """
    )
    proc = run_python(BLOCKER + CORE_PIPELINE + check, tmp_path)
    assert proc.stdout.strip().endswith("ok")


def test_import_pipekit_imports_no_geo_package(tmp_path):
    code = textwrap.dedent(
        f"""
        import sys

        import pipekit
        import pipekit.datasets
        import pipekit.samplers
        import pipekit.transforms
        from pipekit.datasets import ImageFolder, TarShards, WebDataset

        loaded = sorted(m for m in sys.modules if m.partition(".")[0] in {GEO_PACKAGES!r})
        assert loaded == [], loaded
        assert "pipekit.geo" not in sys.modules
        assert pipekit.geo.RasterDataset is pipekit.datasets.RasterDataset  # installed: the names load on use
        assert pipekit.samplers.GridGeoSampler is pipekit.geo.GridGeoSampler
        print("ok")
        """
    )
    assert run_python(code, tmp_path).stdout.strip() == "ok"


@pytest.mark.parametrize("name", ["pipekit", "pipekit.datasets", "pipekit.samplers"])
def test_every_lazy_name_resolves_and_is_listed(name):
    import importlib

    module = importlib.import_module(name)
    assert set(module.__all__) <= set(dir(module))
    for member in module.__all__:
        assert getattr(module, member) is not None, member
    namespace: dict = {}
    exec(f"from {name} import *", namespace)
    assert set(module.__all__) <= set(namespace)


class TestOptional:
    def test_missing_geo_package_follows_causes(self):
        inner = ModuleNotFoundError("No module named 'shapely'", name="shapely.geometry")
        outer = ImportError("wrapped")
        outer.__cause__ = inner
        assert _optional.missing_geo_package(outer) == "shapely"
        assert _optional.missing_geo_package(ModuleNotFoundError("x", name="scipy")) is None
        assert _optional.missing_geo_package(ValueError("x")) is None

    def test_import_optional_leaves_other_errors_alone(self):
        with pytest.raises(ModuleNotFoundError) as info:
            _optional.import_optional("pipekit_no_such_module_here")
        assert "pipekit[geo]" not in str(info.value)
        assert _optional.import_optional("pipekit.pipes").__name__ == "pipekit.pipes"

    def test_lazy_attributes(self):
        namespace: dict = {}
        get, names = _optional.lazy_attributes("demo", {"dumps": "json", "decoder": "json.decoder"}, namespace)
        import json

        assert get("dumps") is json.dumps and namespace["dumps"] is json.dumps
        with pytest.raises(AttributeError, match="module 'demo' has no attribute 'nope'"):
            get("nope")
        assert names() == ["decoder", "dumps"]

    def test_require_geo_names_the_extra(self, monkeypatch):
        _optional.require_geo("pipekit.geo")  # the dev environment has the geo extra
        real = _optional.importlib.util.find_spec
        monkeypatch.setattr(
            _optional.importlib.util, "find_spec", lambda name: None if name == "pyproj" else real(name)
        )
        with pytest.raises(ModuleNotFoundError, match=r"pipekit.geo needs the 'pyproj' package.*pipekit\[geo\]"):
            _optional.require_geo("pipekit.geo")

    def test_the_extra_lists_the_packages(self):
        import tomllib

        extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        names = {spec.split(">")[0].split("=")[0].split("[")[0] for spec in extras["geo"]}
        assert names == set(GEO_PACKAGES)
