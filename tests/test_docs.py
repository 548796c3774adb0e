"""The documentation site (mkdocs.yml, docs/) builds, covers the public API, and its code runs.

- The site builds with ``mkdocs build --strict``: a broken link, a missing reference or a
  docstring griffe cannot read fails it.
- Every public name (the ``__all__`` of every module with a reference page) is in the
  generated objects inventory (``objects.inv``), so the API reference documents it.
- Every ```` ```python ```` block of the guides runs (in a temporary folder, like the
  README's); ```` ```pycon ```` blocks are shown, not run (CONTRIBUTING.md, "Documentation").
  The S3 blocks run against the test suite's local S3 server.
- Every ``pipekit ...`` line of a ```` ```bash ```` block parses with the CLI's own parser.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GUIDES = sorted(p for p in DOCS.rglob("*.md") if "reference" not in p.relative_to(DOCS).parts)
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", flags=re.S | re.M)


def _blocks(language: str) -> list[tuple[str, str]]:
    found = []
    for page in GUIDES:
        for i, (lang, code) in enumerate(FENCE.findall(page.read_text())):
            if lang == language:
                found.append((f"{page.relative_to(DOCS)}[{i}]", code))
    return found


PYTHON = _blocks("python")
BASH = _blocks("bash")


def read_inventory(path: Path) -> set[str]:
    """The object names of a Sphinx ``objects.inv`` (version 2: four header lines, then zlib)."""
    data = path.read_bytes()
    header, _, body = data.partition(b"# The remainder of this file is compressed using zlib.\n")
    if not header.startswith(b"# Sphinx inventory version 2"):
        raise ValueError(f"{path}: not a Sphinx inventory (version 2)")
    return {line.split(" ", 1)[0] for line in zlib.decompress(body).decode().splitlines() if line.strip()}


REFERENCE = sorted((DOCS / "reference").rglob("*.md"))


def _directives(page: Path) -> list[str]:
    return re.findall(r"^::: ([\w.]+)", page.read_text(), re.M)


def reference_modules() -> list[str]:
    """The modules documented by the reference pages' ``::: module`` directives (not ``::: module.Name`` ones)."""
    found = {name for page in REFERENCE for name in _directives(page)}
    return sorted(name for name in found if _is_module(name))


def _is_module(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env["NO_MKDOCS_2_WARNING"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


@pytest.mark.slow
def test_site_builds_strict(site):
    assert (site / "index.html").is_file()
    for page in GUIDES:
        html = site / page.relative_to(DOCS).with_suffix("") / "index.html"
        if page.name == "index.md":
            html = site / page.relative_to(DOCS).parent / "index.html"
        assert html.is_file(), f"{page} was not built"


@pytest.mark.slow
def test_reference_documents_every_public_name(site):
    inventory = read_inventory(site / "objects.inv")
    modules = reference_modules()
    for required in (
        "pipekit",
        "pipekit.pipes",
        "pipekit.datasets",
        "pipekit.geo",
        "pipekit.transforms",
        "pipekit.collate",
        "pipekit.device",
        "pipekit.errors",
        "pipekit.retry",
        "pipekit.samplers",
        "pipekit.adapters",
        "pipekit.dataloader2",
        "pipekit.encoders",
        "pipekit.decoders",
        "pipekit.synthetic",
    ):
        assert required in modules, f"no reference page documents {required}"
    missing = []
    for name in modules:
        module = importlib.import_module(name)
        for member in getattr(module, "__all__", []):
            value = getattr(module, member)
            if isinstance(value, type(module)):  # a submodule: its own page, or its names on this one
                if f"{name}.{member}" not in modules and name != "pipekit":
                    undocumented = [n for n in getattr(value, "__all__", ["?"]) if f"{name}.{n}" not in inventory]
                    assert undocumented == [], f"{name}.{member} has no page and {name} lacks {undocumented}"
                continue
            if f"{name}.{member}" not in inventory:
                missing.append(f"{name}.{member}")
    assert missing == []


def test_reference_covers_the_locked_public_api():
    spec = importlib.util.spec_from_file_location("public_api", ROOT / "tests" / "test_public_api.py")
    public_api = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(public_api)
    text = "\n".join(p.read_text() for p in REFERENCE)
    assert "::: pipekit.pipes\n" in text  # documents pipekit.pipes.__all__, i.e. PIPES_ALL
    import pipekit.pipes

    assert sorted(pipekit.pipes.__all__) == public_api.PIPES_ALL
    top = re.search(r"::: pipekit\n(.*?)(?:\n\n|\Z)", text, re.S).group(1)
    assert all(f"- {name}" in top for name in [*public_api.DATALOADER2_NAMES, "DataLoader"])


def test_pipes_reference_has_a_page_per_family_naming_each_pipe_once():
    # pipekit.pipes is one page per family module under reference/pipes/ (reference/pipes.md holds the bases and
    # the list): each public name on exactly one page, each from its own family module (one page was 1.6 MB)
    import pipekit.pipes

    pages = {p.stem: _directives(p) for p in (DOCS / "reference" / "pipes").glob("*.md")}
    named = [d.removeprefix("pipekit.pipes.") for ds in pages.values() for d in ds]
    assert sorted(named) == sorted(set(named)), "a pipe is on two family pages"
    index = (DOCS / "reference" / "pipes.md").read_text()
    on_index = [n.strip() for n in re.search(r"members: \[(.*)\]", index).group(1).split(",")]
    assert sorted([*named, *on_index]) == sorted(pipekit.pipes.__all__)
    for stem, directives in pages.items():
        family = importlib.import_module(f"pipekit.pipes._{stem.replace('-', '_')}")
        assert {d.removeprefix("pipekit.pipes.") for d in directives} <= set(family.__all__), stem
        assert f"(pipes/{stem}.md)" in index, f"reference/pipes.md does not link {stem}"
    nav = (ROOT / "mkdocs.yml").read_text()
    assert all(f"reference/pipes/{stem}.md" in nav for stem in pages)


def _figures_script():
    spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "scripts" / "docs_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pictures_exist_and_are_all_shown():
    # the pictures are committed (the site builds without drawing them) and ./run docs redraws them
    shown = {
        (page.parent / ref).resolve()
        for page in GUIDES
        for ref in re.findall(r"!\[[^\]]*\]\(([^)\s]+\.png)\)", page.read_text())
    }
    drawn = {p.resolve() for p in (DOCS / "assets" / "figures").glob("*.png")}
    assert len(drawn) >= 6
    assert shown - drawn == set(), "a page shows a picture that is not there"
    assert drawn - shown == set(), "a picture no page shows"


def test_pictures_script_draws_the_benchmark_ratios(tmp_path):
    # the whole script takes ~20 s (a synthetic corpus, torchvision): CI draws the quickest figure only
    figures = _figures_script()
    rows = figures.benchmark_ratios()
    assert len(rows) >= 6 and all(0 < low <= high for _, low, high in rows)
    assert any(label.startswith("pipes_overhead") for label, _, _ in rows)
    assert figures.main(["--only", "ratios", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "benchmark-ratios.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_guides_have_code():
    assert len(PYTHON) >= 15
    assert BASH


@pytest.fixture
def docs_bucket(s3_server, tmp_path_factory, monkeypatch):
    from pipekit.synthetic.geo import write_landsat_cdl_corpus

    root = write_landsat_cdl_corpus(tmp_path_factory.mktemp("docs-corpus"), size=256, scenes=1, progress=False)
    bucket = s3_server.create_bucket()
    fs = s3_server.fs()
    for path in sorted(Path(root).rglob("*.TIF")) + sorted(Path(root).rglob("*.tif")):
        fs.put(str(path), f"{bucket}/{path.relative_to(root).as_posix()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    monkeypatch.setenv("PIPEKIT_DOCS_BUCKET", bucket)
    return bucket


def _run(name: str, code: str) -> None:
    exec(compile(code, f"docs/{name}", "exec"), {"__name__": "docs_snippet"})


LOCAL = [(n, c) for n, c in PYTHON if "AWS_ENDPOINT_URL" not in c]
REMOTE = [(n, c) for n, c in PYTHON if "AWS_ENDPOINT_URL" in c]


def _params(blocks: list[tuple[str, str]]) -> list:
    # blocks that write a synthetic raster corpus take seconds (GeoSegmentation computes statistics too)
    return [
        pytest.param(n, c, id=n, marks=[pytest.mark.slow] if "write_landsat_cdl_corpus" in c else []) for n, c in blocks
    ]


@pytest.mark.parametrize(("name", "code"), _params(LOCAL))
def test_python_block_runs(name, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _run(name, code)


@pytest.mark.s3
@pytest.mark.parametrize(("name", "code"), _params(REMOTE))
def test_s3_python_block_runs(name, code, tmp_path, monkeypatch, docs_bucket):
    monkeypatch.chdir(tmp_path)
    _run(name, code)


def test_command_lines_parse():
    from pipekit.cli import build_parser

    lines = [
        (name, line.split("#", 1)[0].strip())
        for name, code in BASH
        for line in code.splitlines()
        if line.startswith("pipekit ")
    ]
    assert lines
    for name, line in lines:
        try:
            build_parser().parse_args(shlex.split(line)[1:])
        except SystemExit as exc:
            raise AssertionError(f"{name}: {line!r} does not parse") from exc


def _extension():
    spec = importlib.util.spec_from_file_location("griffe_pipekit", DOCS / "griffe_pipekit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docstring_extension_reads_pipekit_conventions():
    rewrite = _extension().rewrite
    doc = (
        "Read it.\n\nArgs:\n    paths: where.\n    crs, res: as :class:`RasterDataset`,\n"
        "        over two lines.\n    seed: the seed.\n\nExample:\n    >>> 1\n    1"
    )
    out = rewrite(doc, parameters={"paths", "crs", "res"}, var_keyword=True, inherited={"seed": "int | None"})
    assert "    crs: as ``RasterDataset``,\n        over two lines.\n    res: as ``RasterDataset``," in out
    assert "Keyword Args:\n    seed (int | None): the seed." in out
    assert "\nExamples:\n    >>> 1" in out
    # without **kwargs, an unknown parameter stays where griffe's strict check sees it
    assert "Keyword Args" not in rewrite(doc, parameters={"paths"}, var_keyword=False)


def test_reliability_page_names_tests_that_exist():
    import ast

    text = (DOCS / "guides" / "reliability.md").read_text()
    refs = re.findall(r"`(tests/[\w/]+\.py)((?:::\w+)*)`", text)
    assert len(refs) >= 10
    for path, names in refs:
        tree = ast.parse((ROOT / path).read_text())
        scope = tree.body
        for name in [n for n in names.split("::") if n]:
            found = [
                node
                for node in scope
                if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name
            ]
            assert found, f"reliability.md names {path}{names}, which has no {name}"
            scope = found[0].body


def _migration_names(page: str, start: str) -> list[str]:
    """The backticked identifiers of the table that starts with ``start`` on a migration page."""
    text = (DOCS / "migration" / page).read_text()
    table = text[text.index(start) :].split("\n\n", 1)[0]
    return re.findall(r"`([A-Za-z_]\w*)`", table)


def test_torchgeo_page_names_exist():
    # the import map by kind lists TorchGeo 0.8 names that pipekit has: each must be importable
    import pipekit.datasets
    import pipekit.datasets.utils
    import pipekit.samplers
    import pipekit.transforms.indices

    modules = (pipekit.datasets, pipekit.datasets.utils, pipekit.samplers, pipekit.transforms.indices)
    names = _migration_names("torchgeo.md", "| kind | names")
    assert len(names) >= 30
    for name in names:
        assert any(name in getattr(m, "__all__", ()) for m in modules), f"torchgeo.md lists {name}, not in pipekit"
    # and every TorchGeo sampler name pipekit has is listed (GeoSamplerPipe is pipekit's own)
    missing = [n for n in pipekit.samplers.__all__ if n not in names and n != "GeoSamplerPipe"]
    assert missing == []
    for fn in (
        "random_bbox_assignment",
        "random_bbox_splitting",
        "random_grid_cell_assignment",
        "roi_split",
        "time_series_split",
        "VectorDataset",
        "NonGeoDataset",
        "NonGeoClassificationDataset",
        "EuroSAT",
    ):
        assert fn in names


def test_torchgeo_page_not_in_pipekit_is_true():
    import pipekit.datasets

    text = (DOCS / "migration" / "torchgeo.md").read_text()
    section = text[text.index("## Not in pipekit") :]
    listed = re.findall(r"^- `(\w+)`", section, flags=re.M)
    assert "XarrayDataset" in listed
    for name in listed:
        assert not hasattr(pipekit.datasets, name), f"torchgeo.md says {name} is not in pipekit, but it is"


def test_torchdata_page_holds_the_port_tests_import_map():
    # tests/test_torchdata_port.py rewrites exactly these import lines: the page must show the same map
    spec = importlib.util.spec_from_file_location("torchdata_port", ROOT / "tests" / "test_torchdata_port.py")
    port = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(port)
    text = (DOCS / "migration" / "torchdata.md").read_text()
    for old, new in port.IMPORT_MAP.items():
        assert old.strip() in text and new.strip() in text, f"torchdata.md lacks {old!r} -> {new!r}"
