"""Subcommands for the main job: ``demo`` (embedded default) and ``generate`` (your own weights)."""

from __future__ import annotations

import argparse
import json

from .common import add_base_arg, add_recipe_args, command, overrides_from, preflight


@command("demo", "run the embedded demo: the plain diffusers error and its fix, real-model savings, the NaN guard, "
                 "this machine's recipe, and pictures of a shipped trained model in fp32, in the recipe's layout and "
                 "naively cast to float16 (offline, < 1 min)",
         "hf_precision.cli.run:_cmd_demo")
def _args_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="demo_output", help="output folder (default: demo_output)")
    p.add_argument("--device", default=None,
                   help="where it runs: cpu, cuda, cuda:1, mps, xpu (default: the best present device)")
    p.add_argument("--layout", default=None, metavar="DEVICE",
                   help="whose device rules choose the dtypes of the last two parts: t4, a100, cpu-amx ... "
                        "(default: --device)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the pictures")
    p.add_argument("--json", action="store_true", help="print the measurements as JSON at the end")


def _cmd_demo(args: argparse.Namespace) -> int:
    from ..apps.demo import run_demo
    from ..apps.outputs import check_output

    check_output(args.out, folder=True)  # before the demo builds and runs its pipelines

    results = run_demo(args.out, device=args.device, layout=args.layout, seed=args.seed)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0 if results["ok"] else 1


@command("generate", "text-to-image with your own weights through the loader", "hf_precision.cli.run:_cmd_generate")
def _args_generate(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="local diffusers folder, Hub id, or recipe alias (sdxl, sd15, pixart)")
    p.add_argument("--prompt", required=True, help="text prompt")
    p.add_argument("--out", default="image.png", help="image file to write (.png, .jpg, .webp)")
    p.add_argument("--steps", type=int, default=30, help="denoising steps")
    p.add_argument("--height", type=int, default=None, help="image height in pixels (default: the pipeline's, from its config)")
    p.add_argument("--width", type=int, default=None, help="image width in pixels (default: the pipeline's, from its config)")
    p.add_argument("--guidance", type=float, default=None, help="guidance scale (default: the pipeline's)")
    p.add_argument("--negative-prompt", default=None, help="negative prompt, where the pipeline takes one (default: none)")
    p.add_argument("--seed", type=int, default=0, help="random seed; the same seed gives the same picture")
    p.add_argument("--recipe", default=None, help="recipe name (default: chosen from model_index.json)")
    p.add_argument("--force", action="store_true",
                   help="use --recipe even for a pipeline class its pipelines: list does not name")
    add_base_arg(p, "model")
    p.add_argument("--max-memory", default=None, metavar="SIZE",
                   help="fit the weights in this much device memory (e.g. 12GB): whole-component offload and the "
                        "quantized storage the recipes tolerate are considered, and the choice is printed")
    add_recipe_args(p)


def _cmd_generate(args: argparse.Namespace) -> int:
    overrides = overrides_from(args) or None
    preflight(args.model, recipe=args.recipe, device=args.layout or args.device, overrides=overrides)  # before torch
    from ..apps.image import generate

    path = generate(args.model, args.prompt, args.out, device=args.device, steps=args.steps, height=args.height,
                    width=args.width, guidance=args.guidance, negative_prompt=args.negative_prompt, seed=args.seed,
                    recipe=args.recipe, overrides=overrides, force=args.force, layout=args.layout,
                    max_memory=args.max_memory, say=print, base=args.base)
    print(f"wrote {path}")
    return 0
