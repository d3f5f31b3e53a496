"""What every subcommand shares: the command registry and the recipe options (``--device``, ``--overrides``, ``--set``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = ["COMMANDS", "command", "add_recipe_args", "overrides_from", "preflight"]

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


def preflight(path: str, *, recipe: str | None = None, device: Any = None, overrides: Any = None,
              weights: bool = True) -> None:
    """Check what can be checked before torch and diffusers are imported (they take seconds): a local folder's
    ``model_index.json`` and component configs (valid JSON), its safetensors headers against the files' sizes
    (``weights=True``; only headers are read), and the recipe with the overrides. The first problem is raised as
    the same one-line error loading would raise later.

    A Hub id or a folder without ``model_index.json`` is left to the loader, which names what is missing.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "model_index.json").write_text('{"_class_name": "StableDiffusionXLPipeline", ')
        >>> preflight(str(folder))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.errors.DamagedFileError: ...model_index.json: damaged file: not valid JSON ...
    """
    from pathlib import Path

    from ..recipe.catalog import recipe_classes
    from ..recipe.files import read_json
    from ..recipe.resolution import get_recipe
    from ..runtime.load import check_files

    index_file = Path(path).expanduser() / "model_index.json"
    if not index_file.is_file():
        return
    check_files(index_file.parent, weights=weights)
    name = recipe or recipe_classes().get(str(read_json(index_file).get("_class_name")))
    if name is None:
        return  # no shipped recipe: load_pipeline composes one, or reports an unknown class with the options
    get_recipe(name, device=device, overrides=overrides)
