"""``hf-precision calibrate``: measure the float32 islands a model needs in half precision, write them as overrides.

Only the argument parser lives at module level; the handler imports torch, diffusers and the work itself.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .common import add_base_arg, command, preflight
from .run import add_image_args

__all__: list[str] = []


@command("calibrate", "measure where a model leaves the half dtype's range (a float32 run with recording hooks) and "
                      "write the smallest float32 islands that make the half run finite, as an override file",
         "hf_precision.cli.calibrate:_cmd_calibrate")
def _args_calibrate(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="a diffusers pipeline folder (model_index.json and weights), or a "
                                                  "single-file checkpoint with --base")
    add_base_arg(p, "MODEL")
    p.add_argument("--device", default=None, metavar="DEVICE",
                   help="where the runs happen: cpu, cuda, cuda:1, mps (default: the best present device)")
    p.add_argument("--layout", default=None, metavar="DEVICE",
                   help="whose device rules choose the dtypes to calibrate: a preset (t4, a100, m1-macos13, cpu-amx) "
                        "or a device; its recipe gives the target half dtype (default: --device)")
    p.add_argument("--run-on", default=None, metavar="DEVICE",
                   help="the old spelling: --run-on X is --device X, and with it --device names the layout")
    p.add_argument("--prompt", default=None,
                   help="the prompt of the runs, where the pipeline takes one (default: a fixed one)")
    add_image_args(p, "the runs")
    p.add_argument("--steps", type=int, default=4, help="denoising steps per run (default: 4)")
    p.add_argument("--height", type=int, default=None,
                   help="image height of the runs (default: the pipeline's; a video model's as `video` takes it)")
    p.add_argument("--width", type=int, default=None,
                   help="image width of the runs (default: the pipeline's; a video model's as `video` takes it)")
    p.add_argument("--frames", type=int, default=None,
                   help="video models: frames of the runs (default: as `video` takes it: the family's, capped to the "
                        "transformer's rotary table)")
    p.add_argument("--target", default=None, choices=["float16", "bfloat16"],
                   help="the half dtype to calibrate (default: the layout's denoiser dtype)")
    p.add_argument("--reference", default=None, choices=["float32", "bfloat16"],
                   help="the reference run's dtype (default: float32 when it fits memory; bfloat16 gives ranges only)")
    p.add_argument("--max-memory", default=None, metavar="SIZE",
                   help="memory budget on --device (e.g. 12GB, 800MB): when the reference run does not fit it whole, "
                        "it runs with model offload, one component at a time; calibrate refuses, saying what to do, "
                        "when even the largest component does not fit")
    p.add_argument("--bound", type=float, default=0.05,
                   help="mean absolute error of the final image (0..1) the islands should stay within (default: 0.05)")
    p.add_argument("--recipe", default=None, metavar="NAME", help="recipe (default: chosen from model_index.json)")
    p.add_argument("--seed", type=int, default=0, help="seed of every run's noise, the same for each dtype compared")
    p.add_argument("--out", default="islands.yaml", metavar="YAML",
                   help="override file to write (default: islands.yaml); load it with --overrides")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the islands, bytes and errors as JSON")


def _cmd_calibrate(args: argparse.Namespace) -> int:
    import dataclasses

    # damaged files named before torch is imported; a single file's base holds the configs and the rest
    preflight(args.model if args.base is None else args.base, recipe=args.recipe, device=args.device)
    from ..units import parse_size
    from ..diagnose.calibration import calibrate

    # One rule: --device is where it runs, --layout whose rules choose the dtypes. The old spelling
    # (--device LAYOUT --run-on DEVICE) still means what it meant.
    layout, run_on = args.layout or args.device, args.run_on or args.device
    if run_on is not None:  # --device t4 without --run-on: refused as check and generate refuse it, before loading
        from ..runtime.placement import torch_device

        torch_device(run_on, "--run-on" if args.run_on else "--device")
    from ..diagnose.call import call_params, size_refused
    from ..diagnose.inputs import image_inputs
    from ..errors import RecipeError

    from ..runtime.single_file import split_single_file

    # a missing file, a pickle, a file without --base: refused before loading, as generate/check/plan refuse them
    single = split_single_file(args.model, args.base, "calibrate")
    configs = single[1] if single is not None else args.model  # what model_index.json and the configs come from
    # before loading: the image, mask and strength as generate checks them; what no flag gives is refused
    given = image_inputs(configs, image=args.image, mask=args.mask, strength=args.strength, steps=args.steps)
    if given.others:
        calls = ", ".join(f"{m!r}: ..." for m in given.others)
        needs = " and ".join([", ".join(given.others[:-1]), given.others[-1]] if len(given.others) > 1 else given.others)
        raise RecipeError(f"{args.model}: {given.pipeline} needs {needs} for its runs; "
                          f"calibrate in Python: hp.calibrate(folder, layout, call={{'prompt': ..., {calls}}})")
    if args.prompt is not None and given.pipeline and "prompt" not in call_params(given.pipeline):
        raise RecipeError(f"--prompt: {given.pipeline} takes no prompt (its runs start from --image); drop --prompt")
    height, width, frames, options = _video_size(args, configs)
    refused = size_refused(given.pipeline, height, width)
    if refused:
        raise RecipeError(refused)
    if args.strength is not None:
        options = {**options, "strength": args.strength}
    result = calibrate(args.model, layout, None, target=args.target, steps=args.steps, bound=args.bound,
                       progress=not args.no_progress, reference=args.reference, run_on=run_on, recipe=args.recipe,
                       seed=args.seed, prompt=args.prompt, image=given.kwargs.get("image"),
                       mask=given.kwargs.get("mask_image"), size=(height, width), frames=frames,
                       options=options, base=args.base,
                       max_memory=parse_size(args.max_memory) if args.max_memory else None)
    path = result.write(args.out)
    if args.json:
        print(json.dumps({"islands": result.islands, "whole": result.whole, "extra_bytes": result.extra_bytes,
                          "whole_component_bytes": result.whole_component_bytes(),
                          "errors": {k: dataclasses.asdict(v) for k, v in result.errors.items()},
                          "notes": result.notes, "out": str(path)}, indent=2))
    else:
        print(result.table())
        base = f", base={args.base!r}" if args.base is not None else ""
        print(f"wrote {path}: load it with hp.load_pipeline({args.model!r}, device{base}, overrides={str(path)!r}) "
              f"or --overrides {path}; the islands cost {result.extra_bytes} extra bytes")
    return 0 if result.finite else 1


def _video_size(args: argparse.Namespace, configs: str | None = None) -> tuple[int | None, int | None, int | None, dict[str, Any]]:
    """(height, width, frames, call options) of the runs: as given, and for a video model what is missing as ``video``
    chooses it (family defaults capped to the position tables, so Wan's default 480x832 cannot overrun a shorter table
    mid-run), with the call kwargs the configs fix (CogVideoX's text length). A size the model cannot take is refused
    before loading. ``configs``: whose configs say the family (``--base`` for a single file; default the model).
    """
    from ..apps.video.spec import model_spec
    from ..errors import RecipeError

    try:
        _, spec = model_spec(configs or args.model)
    except RecipeError:  # not a video pipeline `video` knows: the pipeline's own defaults
        return args.height, args.width, args.frames, {}
    height = args.height or spec.defaults["height"]
    width = args.width or spec.defaults["width"]
    frames = args.frames or spec.defaults["frames"]
    problems = spec.check(height=height, width=width, frames=frames)
    if problems:
        raise RecipeError("; ".join(problems))
    return height, width, frames, dict(spec.extra)

