"""The ``pipekit`` command as a whole: help everywhere, one-line errors with status 2, entry points."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipekit.cli import build_parser
from pipekit.cli._common import CliError, parse_storage_options

COMMANDS = ["demo", "inspect", "preview", "bench", "shard"]


def one_line(err: str) -> bool:
    return err.strip() != "" and "\n" not in err.strip()


class TestHelp:
    def test_top_level_help(self, cli):
        code, out, err = cli("--help")
        assert code == 0 and err == ""
        assert out.startswith("usage: pipekit")
        for command in COMMANDS:
            assert command in out

    @pytest.mark.parametrize("command", COMMANDS)
    def test_each_command_has_help(self, cli, command):
        code, out, _ = cli(command, "--help")
        assert code == 0
        assert out.startswith(f"usage: pipekit {command}")
        assert "--verbose" in out

    def test_every_subparser_is_wired(self):
        parser = build_parser()
        sub = next(a for a in parser._actions if a.dest == "command")
        assert sorted(sub.choices) == sorted(COMMANDS)
        for name, p in sub.choices.items():
            assert p.get_default("func") is not None, name


def test_version(cli):
    import pipekit

    code, out, err = cli("--version")
    assert (code, out, err) == (0, f"pipekit {pipekit.__version__}\n", "")


class TestBadInput:
    def test_no_command(self, cli):
        code, out, err = cli()
        assert code == 2 and out == ""
        assert one_line(err) and "required" in err

    def test_unknown_command(self, cli):
        code, _, err = cli("train")
        assert code == 2 and one_line(err) and "invalid choice: 'train'" in err

    def test_unknown_option(self, cli):
        code, _, err = cli("inspect", ".", "--frobnicate")
        assert code == 2 and one_line(err) and "--frobnicate" in err

    def test_unknown_product(self, cli, rasters):
        code, _, err = cli("inspect", rasters, "--product", "landsat10")
        assert code == 2 and one_line(err)
        assert "invalid choice: 'landsat10'" in err and "landsat8" in err

    @pytest.mark.parametrize("argv", [
        ["inspect", "{missing}"],
        ["preview", "{missing}", "--out", "{tmp}/x.png"],
        ["bench", "{missing}", "--workers", "0"],
    ])
    def test_missing_path(self, cli, tmp_path, argv):
        missing = tmp_path / "nowhere"
        code, out, err = cli(*[a.format(missing=missing, tmp=tmp_path) for a in argv])
        assert code == 2 and out == ""
        assert one_line(err)
        assert err.startswith(f"pipekit {argv[0]}: error: no such file or directory")
        assert str(missing) in err

    @pytest.mark.parametrize("value", ["0", "-3", "many"])
    def test_bad_numbers(self, cli, value):
        code, _, err = cli("demo", "--steps", value)
        assert code == 2 and one_line(err) and "--steps" in err

    def test_bad_storage_option(self, cli, rasters):
        code, _, err = cli("inspect", rasters, "-o", "endpoint_url")
        assert code == 2 and one_line(err) and "KEY=VALUE" in err


class TestStorageOptions:
    def test_values_and_nesting(self):
        assert parse_storage_options(["anon=true", "max_concurrency=4", "key=abc", "profile=null"]) == {
            "anon": True, "max_concurrency": 4, "key": "abc", "profile": None}
        assert parse_storage_options(["client_kwargs.endpoint_url=http://h:1", "client_kwargs.region_name=r"]) == {
            "client_kwargs": {"endpoint_url": "http://h:1", "region_name": "r"}}
        assert parse_storage_options(["secret=a=b"]) == {"secret": "a=b"}

    @pytest.mark.parametrize("bad", [["=x"], ["a..b=1"], ["a=1", "a.b=2"], ["a.b=2", "a=1"]])
    def test_malformed(self, bad):
        with pytest.raises(CliError):
            parse_storage_options(bad)


class TestEntryPoints:
    def test_python_dash_m(self, tmp_path):
        proc = subprocess.run([sys.executable, "-m", "pipekit", "inspect", str(tmp_path / "nowhere")],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2
        assert proc.stdout == ""
        assert proc.stderr.strip().splitlines() == [
            f"pipekit inspect: error: no such file or directory: '{tmp_path / 'nowhere'}'"]

    def test_console_script_is_declared(self):
        from pathlib import Path

        text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
        scripts = text.split("[project.scripts]", 1)[1].split("[", 1)[0]
        assert scripts.strip().splitlines() == ['pipekit = "pipekit.cli:main"']
