"""The ``hf-precision`` command line. User errors exit with code 2 and one message, never a traceback."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .errors import RecipeError

__all__ = ["main", "build_parser"]

EXAMPLES = """examples:
  hf-precision recipes
  hf-precision devices
  hf-precision show sdxl --device t4
  hf-precision show svd --device a100 --set vae.dtype=float32 --json
  hf-precision plan sdxl --device t4
  hf-precision check ./my-sdxl-folder --device cpu
  hf-precision demo --out demo_output
"""


def _add_recipe_args(p: argparse.ArgumentParser, device_help: str | None = None) -> None:
    p.add_argument("--device", default=None, help=device_help or
                   "device to resolve for: cpu, cuda, cuda:1, mps, xpu, a preset (t4, a100, m1-macos13, cpu-amx; see "
                   "`hf-precision devices`) or a description (cuda:sm75, mps:macos=13.6). Default: the best present device")
    p.add_argument("--overrides", action="append", default=[], metavar="YAML",
                   help="override file merged over the recipe (repeatable; later files win)")
    p.add_argument("--set", dest="set_", action="append", default=[], metavar="COMPONENT.KEY=VALUE",
                   help="one override, e.g. --set vae.dtype=float32 or --set unet.keep_fp32=[time_embedding] (repeatable; wins over files)")


def overrides_from(args: argparse.Namespace) -> list[Any]:
    """The override layers of parsed arguments, in merge order: files, then --set flags."""
    from .recipe import parse_set

    layers: list[Any] = list(args.overrides)
    if args.set_:
        layers.append({**parse_set(args.set_), "__source__": "--set"})
    return layers


def _cmd_recipes(args: argparse.Namespace) -> int:
    from .recipe import list_recipes

    data = {"pipeline": list_recipes("pipeline"), "component": list_recipes("component")}
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print("pipeline recipes:  " + ", ".join(data["pipeline"]))
        print("component recipes: " + ", ".join(data["component"]))
        print("\nshow one with: hf-precision show NAME --device DEVICE")
    return 0


def _cmd_devices(args: argparse.Namespace) -> int:
    from .devices import device_caps, list_presets

    rows = []
    for name in ["this machine", *list_presets()]:
        caps = device_caps(None if name == "this machine" else name)
        rows.append({"device": name, "label": caps.profile.label(), "compute": list(caps.compute),
                     "auto": list(caps.auto), "storage": list(caps.storage), "tags": list(caps.tags),
                     "upcast_attention": caps.upcast_attention})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        print(f"{r['device']:<13} {r['label']}")
        print(f"{'':<13} compute {','.join(r['compute'])}  picks unasked {','.join(r['auto'])}  tags {','.join(r['tags'])}"
              + ("  attention upcast" if r["upcast_attention"] else ""))
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    from .recipe import get_recipe

    recipe = get_recipe(args.name, device=args.device, overrides=overrides_from(args))
    print(recipe.to_json() if args.json else recipe.table(why=not args.brief))
    return 0


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], str]] = {}


def command(name: str, help: str, handler: str) -> Callable[[Callable[[argparse.ArgumentParser], None]], Callable[[argparse.ArgumentParser], None]]:
    """Register a subcommand: the decorated function adds its arguments; ``handler`` is 'module:function'."""
    def wrap(fn: Callable[[argparse.ArgumentParser], None]) -> Callable[[argparse.ArgumentParser], None]:
        COMMANDS[name] = (help, fn, handler)
        return fn
    return wrap


@command("recipes", "list the shipped recipes", "hf_precision.cli:_cmd_recipes")
def _args_recipes(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")


@command("devices", "list this machine and the device presets you can plan for", "hf_precision.cli:_cmd_devices")
def _args_devices(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")


@command("show", "resolve a recipe for a device and print it", "hf_precision.cli:_cmd_show")
def _args_show(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="recipe name (sdxl, svd, vae.sdxl ...) or path to your own recipe YAML")
    _add_recipe_args(p)
    p.add_argument("--json", action="store_true", help="print the resolved recipe as JSON")
    p.add_argument("--brief", action="store_true", help="table only, without the decisions")


def _load_optional_commands() -> None:
    # Each hf_precision/cli_*.py module registers its subcommands with @command on import (only the parsers:
    # the heavy work is imported by the handler when the command runs).
    import importlib
    import pkgutil

    import hf_precision

    for info in sorted(pkgutil.iter_modules(hf_precision.__path__), key=lambda i: i.name):
        if info.name.startswith("cli_"):
            importlib.import_module(f"hf_precision.{info.name}")


def build_parser() -> argparse.ArgumentParser:
    _load_optional_commands()
    parser = argparse.ArgumentParser(prog="hf-precision", description="Dtype and device recipes for diffusers pipelines.",
                                     epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help, add_args, _) in COMMANDS.items():
        p = sub.add_parser(name, help=help, description=help)
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

    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    module, _, func = COMMANDS[args.command][2].partition(":")
    handler = getattr(importlib.import_module(module), func)
    try:
        return int(handler(args) or 0)
    except RecipeError as err:
        print(f"hf-precision {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # `python -m hf_precision.cli` runs this file as __main__; the subcommand modules register on the real
    # hf_precision.cli module, so dispatch through it.
    from hf_precision.cli import main as _main

    sys.exit(_main())
