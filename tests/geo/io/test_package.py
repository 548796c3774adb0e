"""``pipekit.geo.io`` as a package: its names, its switches, and which module may import which."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pipekit.geo.io as geo_io
from pipekit.geo.io import _gdal_config, handles, lanes, opener

PACKAGE = Path(geo_io.__file__).parent

# a module may import only modules of a lower layer: the opener knows nothing of threads or handles
LAYERS = {
    "_errors": 0,
    "_gdal_config": 0,
    "_s3_options": 0,
    "_fsspec": 1,
    "_retry": 1,
    "opener": 2,
    "lanes": 3,
    "_prefetch": 3,
    "handles": 4,
}

SETTINGS = [
    ("REMOTE_IO_THREADS", lanes),
    ("GDAL_OPTIONS", _gdal_config),
    ("REMOTE_GDAL_OPTIONS", _gdal_config),
]


def _runtime_imports(path: Path) -> set[str]:
    """The ``pipekit.geo.io`` modules ``path`` imports when it runs (not those imported for type checking only)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module == "pipekit.geo.io":
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pipekit.geo.io."):
            found.add(node.module.split(".")[3])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[3] for a in node.names if a.name.startswith("pipekit.geo.io."))
    return found


def test_every_module_is_layered():
    assert {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"} == set(LAYERS)


@pytest.mark.parametrize("module", sorted(LAYERS))
def test_a_module_imports_only_lower_layers(module):
    for imported in _runtime_imports(PACKAGE / f"{module}.py"):
        assert LAYERS[imported] < LAYERS[module], f"{module} imports {imported}"


def test_the_opener_never_asks_which_thread_it_runs_on():
    source = (PACKAGE / "opener.py").read_text()
    assert "on_io_thread" not in source and "current_thread" not in source and "lane_env" not in source


@pytest.mark.parametrize(("name", "home"), SETTINGS)
def test_a_setting_read_on_the_package_is_its_modules(name, home):
    assert getattr(geo_io, name) is getattr(home, name)


def test_the_fast_paths_are_switched_in_the_registry_only():
    """The package's fast paths have no module switch of their own left: pipekit._fast decides."""
    for name in ("FAST_FETCH", "PREFETCH_TILES", "LANE_ENV", "CONCURRENT_PARTS"):
        assert not hasattr(geo_io, name)
        assert all(name not in (PACKAGE / f"{m}.py").read_text() for m in LAYERS)


def test_names_used_as_geo_io_x_are_the_modules_own():
    from pipekit.geo.io import _errors, _prefetch, _retry, _s3_options

    homes = {
        _errors: ["error_reason", "OpenerReadError", "surfacing_opener_errors"],
        _gdal_config: ["_gdal_retry_options"],
        _s3_options: ["_s3_gdal_options"],
        _retry: ["is_transient_gdal", "retry_read", "store_unreachable"],
        _prefetch: ["_TilePrefetcher"],
        opener: ["RasterOpener"],
        handles: [
            "RasterHandle", "open_handle", "cached_handle", "evict_handle", "cached_handle_count",
            "close_cached_handles", "set_handle_budget", "handle_budget",
        ],
        lanes: ["run_remote", "run_parts", "on_io_thread", "leave_lane_env", "uses_gdal_network"],
    }
    for home, names in homes.items():
        for name in names:
            assert getattr(geo_io, name) is getattr(home, name), name
    for name in geo_io.__all__:
        assert getattr(geo_io, name) is not None
