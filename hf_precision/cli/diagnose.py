"""``hf-precision plan`` and ``hf-precision check``: the diagnostics subcommands (registered on import by cli.py).

Only the argument parsers live at module level; the handlers import torch, diffusers and the work itself.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from .common import PLAN_DEVICE_HELP, add_base_arg, add_recipe_args, command, overrides_from, preflight, resolve_for
from ..errors import RecipeError
from .run import add_image_args

__all__: list[str] = []


@command("plan", "plan a pipeline from its configs alone (meta device, no weights): parameters, bytes per dtype, "
                 "float32 modules and why", "hf_precision.cli.diagnose:_cmd_plan")
def _args_plan(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME_OR_FOLDER",
                   help="a recipe alias (sdxl, svd, pixart, dit, sd15: the real configs shipped with hf_precision), a "
                        "folder with model_index.json and component config.json files (weights not needed), or a "
                        "Hub id")
    add_recipe_args(p, PLAN_DEVICE_HELP)
    p.add_argument("--recipe", default=None, metavar="NAME",
                   help="recipe to plan with (default: the alias, or the one covering model_index.json's _class_name)")
    p.add_argument("--force", action="store_true",
                   help="use --recipe even for a pipeline class its pipelines: list does not name")
    p.add_argument("--modules", action="store_true", help="also list every module with its parameters and planned dtype")
    p.add_argument("--json", action="store_true", help="print the plan as JSON (exact byte counts)")
    add_base_arg(p, "NAME_OR_FOLDER")


def _cmd_plan(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..runtime.source import check_name, shipped_configs

    # A typo or a damaged config fails in a blink, before torch and diffusers are imported; plan reads no weights.
    from ..runtime.single_file import PICKLE_SUFFIXES, SINGLE_FILE_SUFFIXES  # torch-free

    if args.base is not None or args.name.lower().endswith(SINGLE_FILE_SUFFIXES + PICKLE_SUFFIXES):
        pass  # plan() names a missing file or base itself
    elif Path(args.name).expanduser().is_dir():
        preflight(args.name, recipe=args.recipe, device=resolve_for(args), overrides=overrides_from(args) or None,
                  weights=False)
    elif args.name not in shipped_configs():
        check_name(args.name)
    from ..diagnose.planner import plan

    result = plan(args.name, device=resolve_for(args), recipe=args.recipe, overrides=overrides_from(args) or None,
                  modules=args.modules, force=args.force, base=args.base)
    print(result.to_json() if args.json else result.table(modules=args.modules))
    return 0


@command("check", "run a saved pipeline once (1 step, tiny) and report dtype/device mismatches, erased float32 "
                  "islands, drift and casts; exit 1 when something is wrong", "hf_precision.cli.diagnose:_cmd_check")
def _args_check(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH", help="a diffusers pipeline folder (model_index.json and weights)")
    add_recipe_args(p, layout=False)
    p.add_argument("--layout", "--for", dest="layout", default=None, metavar="DEVICE",
                   help="resolve the recipe for another device (a preset such as t4 or a100) and run that layout on "
                        "--device: checks a T4 layout on this machine (--for is the old name)")
    p.add_argument("--recipe", default=None, metavar="NAME",
                   help="recipe to load with (default: the one covering model_index.json's _class_name)")
    p.add_argument("--force", action="store_true",
                   help="use --recipe even for a pipeline class its pipelines: list does not name")
    p.add_argument("--plain", action="store_true",
                   help="load with plain diffusers (DiffusionPipeline.from_pretrained(PATH, dtype=...)), no recipe and "
                        "no hooks: shows what breaks without hf_precision")
    p.add_argument("--dtype", action="append", default=[], metavar="[COMPONENT=]DTYPE",
                   help="with --plain: the from_pretrained dtype, one for all (--dtype float16) or per component "
                        "(--dtype unet=float16; the rest float32 unless --dtype default=... is given); repeatable")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    add_base_arg(p, "PATH")
    add_image_args(p, "its one tiny call, resized to the call's size", "one made up at the call's size",
                   "1, with the fewest steps a smaller one denoises one of")


def _plain_dtype(values: list[str]) -> Any:
    """``--dtype`` flags -> what ``from_pretrained(dtype=...)`` takes: one torch dtype or a component mapping."""
    from .. import dtypes as dt

    def one(text: str, flag: str) -> Any:
        name = dt.canonical(text)
        if name is None:
            raise RecipeError(f"--dtype {flag}: unknown dtype {text!r}; allowed: {dt.allowed_names()}")
        return dt.to_torch(name)

    if not values:
        return None
    if len(values) == 1 and "=" not in values[0]:
        return one(values[0], values[0])
    mapping: dict[str, Any] = {}
    for flag in values:
        component, eq, name = flag.partition("=")
        if not eq or not component.strip():
            raise RecipeError(f"--dtype {flag}: with several --dtype flags write COMPONENT=DTYPE "
                              f"(e.g. --dtype unet=float16 --dtype default=float32)")
        mapping[component.strip()] = one(name.strip(), flag)
    mapping.setdefault("default", one("float32", "default=float32"))
    return mapping


def _load_plain(path: str, dtypes: list[str], device: str | None) -> Any:
    from diffusers import DiffusionPipeline

    dtype = _plain_dtype(dtypes)
    kwargs = {"dtype": dtype} if dtype is not None else {}
    try:
        pipe = DiffusionPipeline.from_pretrained(path, **kwargs)
    except Exception as err:
        from ..runtime.load import check_files

        check_files(path)  # a damaged file: name it and say how to get a good copy
        if not isinstance(err, (OSError, ValueError)):
            raise
        raise RecipeError(f"{path}: plain diffusers cannot load it ({err})") from None
    if device is not None:
        from ..runtime.placement import torch_device

        pipe.to(torch_device(device, "--device"))
    return pipe


def _cmd_check(args: argparse.Namespace) -> int:
    from pathlib import Path

    if args.base is not None and args.plain:
        raise RecipeError("--plain loads a diffusers folder with plain diffusers: drop --base (or drop --plain)")
    if args.base is None and not Path(args.path).expanduser().is_dir():
        raise RecipeError(f"{args.path}: no such folder; check runs a saved pipeline: pass its folder (model_index.json "
                          f"and weights). To plan without weights: hf-precision plan {args.path}")
    given = None
    if args.image is not None or args.mask is not None or args.strength is not None:  # checked before loading
        from ..diagnose.inputs import image_inputs

        given = image_inputs(args.path if args.base is None else args.base, image=args.image, mask=args.mask,
                             strength=args.strength, required=False)
    if args.plain:
        used = [flag for flag, on in (("--recipe", args.recipe), ("--overrides", args.overrides), ("--set", args.set_),
                                      ("--layout", args.layout), ("--force", args.force)) if on]
        if used:
            raise RecipeError(f"--plain loads without a recipe: drop {', '.join(used)} (or drop --plain)")
        preflight(args.path)  # damaged files are named before torch is imported
        pipe = _load_plain(args.path, args.dtype, args.device)
    else:
        if args.dtype:
            raise RecipeError("--dtype goes with --plain; with a recipe write --set COMPONENT.dtype=DTYPE")
        recipe: Any = args.recipe
        overrides: Any = overrides_from(args) or None
        # Damaged files, a bad --set: named in a blink, before torch and diffusers are imported.
        preflight(args.path, recipe=recipe, device=args.layout or args.device, overrides=overrides)
        from ..runtime.load import load_pipeline

        pipe = load_pipeline(args.path, args.device, recipe=recipe, overrides=overrides, layout=args.layout,
                             force=args.force, base=args.base)
    from ..diagnose.call import default_call
    from ..diagnose.checker import check

    report = check(pipe, call=default_call(pipe, given.kwargs) if given is not None else None)
    print(report.to_json() if args.json else report.table(_plain_flags if args.plain else None))
    return report.exit_code


_SET_GROUP = re.compile(r"`((?:--set [\w.<>]+\.dtype=\w+ ?)+)`(?: \(YAML: components: \{(?:[^{}]|\{[^{}]*\})*\}\))?")


def _plain_flags(text: str) -> str:
    """The fixes of a ``--plain`` check in the flags ``--plain`` takes: ``--dtype C=D``, never ``--set`` (refused there).

    Example:
        >>> _plain_flags("agree: `--set vae.dtype=float16 --set unet.dtype=float16` (YAML: components: {vae: {dtype: float16}})")
        'agree: add `--dtype vae=float16 --dtype unet=float16` to --plain (or drop --plain to load with the recipe)'
    """
    def swap(m: re.Match[str]) -> str:
        flags = " ".join(f"--dtype {c}={d}" for c, d in re.findall(r"--set ([\w<>]+)\.dtype=(\w+)", m[1]))
        return f"add `{flags}` to --plain (or drop --plain to load with the recipe)"

    return _SET_GROUP.sub(swap, text)
