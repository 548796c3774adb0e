"""Every Python snippet in the README runs as documented, and its links into the docs resolve.

Snippets that read the AWS variables run against the test suite's local S3
server, with the synthetic Landsat 8 + CDL corpus uploaded to a bucket.

The README is the first visit (what pipekit is, the two commands, a short
tour); the rest of what it used to hold (the Reliability table, the
migration maps, the CLI, benchmark figures, every other tour snippet) lives
in ``docs/``, whose code blocks ``tests/test_docs.py`` runs.  The tests below
check that the README still has a tour that runs, that every relative link
of it names a file that exists, and that the pages the moved content lives
in are linked from it.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_snippets():
    # a short tour in the README (local and S3); the snippets it used to hold run from docs/ now
    assert len(SNIPPETS) >= 5
    assert any("AWS_ENDPOINT_URL" in s for s in SNIPPETS)
    docs_blocks = [
        block
        for page in (README.parent / "docs").rglob("*.md")
        if "reference" not in page.relative_to(README.parent / "docs").parts
        for block in re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)
    ]
    assert len(SNIPPETS) + len(docs_blocks) >= 8 + 15


LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_relative_links_resolve():
    links = [link for link in LINK.findall(README.read_text()) if not urlsplit(link).scheme]
    assert links
    for link in links:
        target = (README.parent / urlsplit(link).path).resolve()
        assert target.exists(), f"README links to {link}, which does not exist"


def test_moved_content_is_linked():
    # what left the README: each page that now holds it is one link away
    text = README.read_text()
    for page in (
        "docs/getting-started.md",
        "docs/guides/reliability.md",
        "docs/guides/performance.md",
        "docs/guides/cli.md",
        "docs/guides/vector-labels.md",
        "docs/guides/time-series-splits.md",
        "docs/guides/chips-downloads.md",
        "docs/migration/torchdata.md",
        "docs/migration/torchgeo.md",
        "docs/migration/webdataset.md",
    ):
        assert f"]({page})" in text, f"the README does not link to {page}"


@pytest.fixture
def readme_bucket(s3_server, tmp_path_factory, monkeypatch):
    from pipekit.synthetic.geo import write_landsat_cdl_corpus

    root = write_landsat_cdl_corpus(tmp_path_factory.mktemp("readme-corpus"), size=256, scenes=1, progress=False)
    bucket = s3_server.create_bucket()
    fs = s3_server.fs()
    for path in sorted(Path(root).rglob("*.TIF")) + sorted(Path(root).rglob("*.tif")):
        fs.put(str(path), f"{bucket}/{path.relative_to(root).as_posix()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    monkeypatch.setenv("PIPEKIT_README_BUCKET", bucket)
    return bucket


def _run(index: int) -> None:
    code = compile(SNIPPETS[index], f"README.md[snippet {index}]", "exec")
    exec(code, {"__name__": f"readme_snippet_{index}"})


LOCAL = [i for i, s in enumerate(SNIPPETS) if "AWS_ENDPOINT_URL" not in s]
REMOTE = [i for i, s in enumerate(SNIPPETS) if "AWS_ENDPOINT_URL" in s]


@pytest.mark.parametrize("index", LOCAL)
def test_snippet_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _run(index)


@pytest.mark.s3
@pytest.mark.parametrize("index", REMOTE)
def test_s3_snippet_runs(index, tmp_path, monkeypatch, readme_bucket):
    monkeypatch.chdir(tmp_path)
    _run(index)


def test_quickstart_commands_match_ci():
    text = README.read_text()
    quick = text.split("## Quickstart", 1)[1].split("##", 1)[0]
    commands = re.findall(r"^(\./run \w+)", quick, flags=re.M)
    assert commands == ["./run demo", "./run test"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert re.search(r"^exec \./run test --all$", ci, flags=re.M), ci  # CI runs every tier
    assert "`./run test --all` runs the whole test suite (what CI runs)" in " ".join(text.split())
