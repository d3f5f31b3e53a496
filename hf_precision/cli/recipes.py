"""``hf-precision recipes | devices | show``: the shipped recipes, the device presets, a resolved recipe."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .common import PLAN_DEVICE_HELP, add_recipe_args, command, overrides_from, resolve_for

__all__: list[str] = []


def _cmd_recipes(args: argparse.Namespace) -> int:
    from ..recipe.catalog import list_recipes

    data = {"pipeline": list_recipes("pipeline"), "component": list_recipes("component")}
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print("pipeline recipes:  " + ", ".join(data["pipeline"]))
        print("component recipes: " + ", ".join(data["component"]))
        print("\nshow one with: hf-precision show NAME --device DEVICE")
    return 0


def _cmd_devices(args: argparse.Namespace) -> int:
    from ..recipe.devices import device_caps, device_profile, list_presets

    specs: dict[str, str | None] = {"this machine": None}
    if device_profile(None).type != "cpu":  # what a GPU machine offloads or places on its CPU follows the CPU's rules
        specs["this cpu"] = "cpu"
    specs.update((name, name) for name in list_presets())
    rows = []
    for name, spec in specs.items():
        caps = device_caps(spec)
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
    from ..errors import RecipeError
    from ..recipe.catalog import list_recipes
    from ..recipe.resolution import get_recipe, resolve

    if (args.name is None) == (args.pipeline_class is None):
        raise RecipeError("show takes a recipe name (hf-precision show sdxl) or --class PIPELINE_CLASS, one of the two")
    import warnings

    with warnings.catch_warnings(record=True) as notes:  # the recipe's notices, said as ours (not a source line)
        warnings.simplefilter("always", UserWarning)
        if args.pipeline_class:
            from ..runtime.source import models_of_class

            recipe = resolve(pipeline_class=args.pipeline_class, models=models_of_class(args.pipeline_class),
                             layout=resolve_for(args), overrides=overrides_from(args) or None)
        else:
            recipe = get_recipe(args.name, device=resolve_for(args), overrides=overrides_from(args))
    for note in dict.fromkeys(str(n.message) for n in notes if issubclass(n.category, UserWarning)):
        print(f"hf-precision show: note: {note}", file=sys.stderr)
    print(recipe.to_json() if args.json else recipe.table(why=not args.brief))
    from ..recipe.requires import loading_note

    needs = loading_note(recipe, args.pipeline_class)
    if needs:
        print(f"hf-precision show: {needs}", file=sys.stderr)
    unchecked = _unchecked_patterns(recipe)
    if unchecked:
        target = args.name if args.name in list_recipes("pipeline") else "FOLDER_WITH_THE_MODEL_CONFIGS"
        print(f"hf-precision show: note: module names and patterns were not checked against the model's modules "
              f"(show reads no model configs): {'; '.join(unchecked)}. To check them: hf-precision plan {target} with the same "
              f"--device/--overrides/--set (plan builds each component from its config.json)", file=sys.stderr)
    return 0


def _unchecked_patterns(recipe: Any) -> list[str]:
    """``component.key: [names] (source)`` for each keep_fp32/entry/layerwise_skip list the user set (not shipped).

    Shipped recipes' patterns are checked against the real configs by the tests; a user's may match nothing.
    """
    out = []
    for plan in recipe.policies:
        for d in plan.decisions:
            if d.field in ("keep_fp32", "entry", "layerwise_skip") and not d.source.startswith("recipes/"):
                out.append(f"{plan.name}.{d.field}: [{d.value}] ({d.source})")
    return out


@command("recipes", "list the shipped recipes", "hf_precision.cli.recipes:_cmd_recipes")
def _args_recipes(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")


@command("devices", "list this machine (and its CPU beside a GPU) and the device presets you can plan for",
         "hf_precision.cli.recipes:_cmd_devices")
def _args_devices(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")


@command("show", "resolve a recipe for a device and print it", "hf_precision.cli.recipes:_cmd_show")
def _args_show(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", default=None,
                   help="recipe name (sdxl, svd, vae.sdxl ...) or path to your own recipe YAML")
    p.add_argument("--class", dest="pipeline_class", default=None, metavar="PIPELINE_CLASS",
                   help="a diffusers pipeline class (FluxControlNetPipeline): its shipped recipe, or one composed from "
                        "the component recipes of the classes in its signature")
    add_recipe_args(p, PLAN_DEVICE_HELP)
    p.add_argument("--json", action="store_true", help="print the resolved recipe as JSON")
    p.add_argument("--brief", action="store_true", help="table only, without the decisions")
