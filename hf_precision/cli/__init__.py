"""The ``hf-precision`` command line. User errors exit with code 2 and one message, never a traceback."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from .common import COMMANDS, HelpFormatter, quiet_optional_dependencies, script_main

__all__ = ["main", "build_parser"]

EXAMPLES = """examples:
  hf-precision recipes
  hf-precision devices
  hf-precision show sdxl --device t4
  hf-precision show svd --device a100 --set vae.dtype=float32 --json
  hf-precision plan sdxl --device t4
  hf-precision check ./my-sdxl-folder --device cpu
  hf-precision demo --out demo_output
  hf-precision calibrate ./my-sdxl-folder --layout t4 --out islands.yaml
  hf-precision train --demo --out demo-lora
"""


# The subcommand modules, in the order `hf-precision --help` lists them; each registers its commands with
# @command on import (parsers only: the heavy work is imported by the handler when the command runs).
COMMAND_MODULES = ("recipes", "diagnose", "run", "video", "train", "calibrate")


def build_parser() -> argparse.ArgumentParser:
    """The ``hf-precision`` parser with every subcommand."""
    import importlib

    for name in COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}")
    parser = argparse.ArgumentParser(prog="hf-precision", description="Dtype and device recipes for diffusers pipelines.",
                                     epilog=EXAMPLES, formatter_class=HelpFormatter)
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("hf_precision")
    except PackageNotFoundError:  # run from a checkout that was never installed
        installed = "(not installed)"
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help, add_args, _, epilog) in COMMANDS.items():
        p = sub.add_parser(name, help=help, description=help, epilog=epilog, formatter_class=HelpFormatter)
        add_args(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``hf-precision``.

    Example:
        >>> main(["show", "sdxl", "--device", "t4", "--brief"])  # doctest: +ELLIPSIS
        recipe sdxl for cuda (Tesla T4, sm 7.5)...
        0
    """
    import importlib

    quiet_optional_dependencies()  # before the command modules import their parsers' choices
    parser = build_parser()

    def run(args: argparse.Namespace) -> int | None:
        if not args.command:
            parser.print_help()
            return 2
        module, _, func = COMMANDS[args.command][2].partition(":")
        return getattr(importlib.import_module(module), func)(args)

    return script_main(parser, run, argv, prog=lambda args: f"hf-precision {args.command}")


