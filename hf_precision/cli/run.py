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


def add_image_args(p: argparse.ArgumentParser, what: str, default: str = "none; required where the call needs one",
                   strength: str = "the pipeline's own, e.g. 0.8 for SD img2img, 0.3 for SDXL img2img") -> None:
    """``--image``, ``--mask`` and ``--strength``: the inputs of image-to-image, edit and inpainting pipelines, one
    spelling for generate, calibrate and check (checked by :func:`hf_precision.diagnose.inputs.image_inputs`)."""
    p.add_argument("--image", default=None, metavar="FILE",
                   help=f"input picture (.png, .jpg, .webp) of {what}, for image-to-image, edit (Kontext) and "
                        f"inpainting pipelines (and image-to-video); refused where the call takes none (default: "
                        f"{default})")
    p.add_argument("--mask", default=None, metavar="FILE",
                   help=f"inpainting mask picture, white where it repaints, black where it keeps --image (default: "
                        f"{default})")
    p.add_argument("--strength", type=float, default=None,
                   help="image-to-image/inpainting: how far back from --image toward noise it starts, in (0, 1]; 1 "
                        f"repaints all; it denoises about steps x strength steps (default: {strength})")


GENERATE_EXAMPLES = """examples:
  hf-precision generate ./stable-diffusion-xl-base-1.0 --prompt "a cat" --device cpu --steps 2 --height 32 --width 32 --out cat.png
  hf-precision generate ./sd-img2img --prompt "a cat, oil painting" --image cat.png --strength 0.75 --steps 4 --device cpu --out painted.png
  hf-precision generate ./sd-inpaint --prompt "a dog" --image cat.png --mask mask.png --steps 2 --device cpu --out dog.png

--image: image-to-image (it starts from the picture, --strength of the way back to noise), edit (Flux Kontext,
Qwen-Image Edit: the picture is a reference) and inpainting (--mask: white where it repaints) pipelines; which of
--image/--mask/--strength a pipeline needs or takes is read from its model_index.json before anything loads.
"""


@command("generate", "one picture with your own weights through the loader: text-to-image, or image-to-image, edit and "
                     "inpainting with --image/--mask", "hf_precision.cli.run:_cmd_generate", GENERATE_EXAMPLES)
def _args_generate(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="local diffusers folder, Hub id, or recipe alias (sdxl, sd15, pixart)")
    p.add_argument("--prompt", required=True, help="text prompt")
    add_image_args(p, "the picture")
    p.add_argument("--out", default="image.png", help="image file to write (.png, .jpg, .webp)")
    p.add_argument("--steps", type=int, default=30, help="denoising steps")
    p.add_argument("--height", type=int, default=None,
                   help="image height in pixels (default: the pipeline's own: from its config; img2img without a "
                        "height argument (SD, SDXL): --image's size, which is resized to --height/--width when given; "
                        "Kontext: fitted to its area from --image)")
    p.add_argument("--width", type=int, default=None, help="image width in pixels (default: as --height)")
    p.add_argument("--guidance", type=float, default=None, help="guidance scale (default: the pipeline's)")
    p.add_argument("--negative-prompt", default=None, help="negative prompt, where the pipeline takes one (default: none)")
    p.add_argument("--seed", type=int, default=0, help="random seed; the same seed gives the same picture")
    p.add_argument("--recipe", default=None, help="recipe name (default: chosen from model_index.json)")
    p.add_argument("--force", action="store_true",
                   help="use --recipe even for a pipeline class its pipelines: list does not name")
    add_base_arg(p, "model")
    p.add_argument("--max-memory", default=None, metavar="SIZE",
                   help="fit the weights in this much device memory (e.g. 12GB): whole-component offload and the "
                        "quantized storage the recipes tolerate are considered, and the choice is printed (default: no "
                        "budget: every weight resident on --device)")
    add_recipe_args(p)


def _cmd_generate(args: argparse.Namespace) -> int:
    overrides = overrides_from(args) or None
    preflight(args.model, recipe=args.recipe, device=args.layout or args.device, overrides=overrides)  # before torch
    from ..apps.image import generate

    path = generate(args.model, args.prompt, args.out, device=args.device, steps=args.steps, height=args.height,
                    width=args.width, guidance=args.guidance, negative_prompt=args.negative_prompt, seed=args.seed,
                    recipe=args.recipe, overrides=overrides, force=args.force, layout=args.layout,
                    max_memory=args.max_memory, say=print, base=args.base, image=args.image, mask=args.mask,
                    strength=args.strength)
    print(f"wrote {path}")
    return 0
