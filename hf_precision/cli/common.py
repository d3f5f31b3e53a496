"""What every subcommand shares: the command registry and the recipe options (``--device``, ``--overrides``, ``--set``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = ["COMMANDS", "command", "add_recipe_args", "overrides_from"]

COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], str]] = {}


def command(name: str, help: str, handler: str) -> Callable[[Callable[[argparse.ArgumentParser], None]], Callable[[argparse.ArgumentParser], None]]:
    """Register a subcommand: the decorated function adds its arguments; ``handler`` is 'module:function'."""
    def wrap(fn: Callable[[argparse.ArgumentParser], None]) -> Callable[[argparse.ArgumentParser], None]:
        COMMANDS[name] = (help, fn, handler)
        return fn
    return wrap


def add_recipe_args(p: argparse.ArgumentParser, device_help: str | None = None) -> None:
    """Add ``--device``, ``--overrides`` and ``--set``: the options of every command that resolves a recipe."""
    p.add_argument("--device", default=None, help=device_help or
                   "device to resolve for: cpu, cuda, cuda:1, mps, xpu, a preset (t4, a100, m1-macos13, cpu-amx; see "
                   "`hf-precision devices`) or a description (cuda:sm75, mps:macos=13.6). Default: the best present device")
    p.add_argument("--overrides", action="append", default=[], metavar="YAML",
                   help="override file merged over the recipe (repeatable; later files win)")
    p.add_argument("--set", dest="set_", action="append", default=[], metavar="COMPONENT.KEY=VALUE",
                   help="one override, e.g. --set vae.dtype=float32 or --set unet.keep_fp32=[time_embedding] (repeatable; wins over files)")


def overrides_from(args: argparse.Namespace) -> list[Any]:
    """The override layers of parsed arguments, in merge order: files, then --set flags."""
    from ..recipe.overrides import Override, parse_set

    layers: list[Any] = list(args.overrides)
    if args.set_:
        layers.append(Override("--set", parse_set(args.set_)))
    return layers
