"""The ``pipekit`` command (also ``python -m pipekit``).

* ``pipekit demo``: write a synthetic Landsat 8 + CDL corpus and train a small
  segmentation model on it through a pipekit pipeline;
* ``pipekit inspect PATH_OR_URL``: what a folder or bucket of rasters, images
  or tar shards holds;
* ``pipekit preview PATH_OR_URL --out sample.png``: render a raster sample
  (RGB, mask, spectral index) to a PNG;
* ``pipekit bench RECIPE_OR_PATH``: throughput of a recipe and the time spent
  in each pipe of its chain;
* ``pipekit shard SRC DST``: write WebDataset tar shards from an image folder,
  a folder of samples or a pipe.

``pipekit --version`` prints the version.

Every subcommand has ``--help``.  Bad input (a missing path, an unknown
product, a malformed option) ends with a one-line error on stderr and exit
status 2; a failure while working (an unreadable file) with a one-line error
and status 1 (``-v`` prints the traceback).
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
import warnings
from collections.abc import Sequence

from pipekit import __version__
from pipekit.cli import _bench as bench
from pipekit.cli import _demo as demo
from pipekit.cli import _inspection as inspection
from pipekit.cli import _preview as preview
from pipekit.cli import _shard as shard
from pipekit.cli._common import CliError, one_line

__all__ = ["main", "build_parser", "CliError"]


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (exit status 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pipekit",
        description="pipekit: composable, resumable DataPipes for PyTorch training data.",
        epilog="Run 'pipekit COMMAND --help' for the options of a command.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages and print tracebacks")
    parser.add_argument("--version", action="version", version=f"pipekit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for module in (demo, inspection, preview, bench, shard):
        module.add_parser(sub)
    for sub_parser in sub.choices.values():
        sub_parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                                help="log debug messages and print tracebacks")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command with ``argv`` (default ``sys.argv[1:]``) and return its exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed)
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s: %(message)s")
    # torchdata's StatefulDataLoader calls torch.set_vital, which torch deprecated: not the user's concern
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
    prog = f"pipekit {args.command}"
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.verbose:
            traceback.print_exc()
        print(f"{prog}: error: {type(exc).__name__}: {one_line(exc)}"
              + ("" if args.verbose else " (run with -v for the traceback)"), file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
