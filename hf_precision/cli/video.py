"""``hf-precision video`` and ``scripts/generate_video.py``: arguments, validation, and the split between processes.

The video work itself lives in :mod:`hf_precision.apps.video`; this module only parses and dispatches.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from ..apps.video import (DEFAULTS, DEMO_DEFAULTS, FORMATS, OFFLOAD, Job, check_out, generate_video, load_video_pipeline,
                          model_class, plan_outputs, read_image, save_video)
from ..errors import RecipeError
from .common import add_recipe_args, command, overrides_from

__all__ = ["add_arguments", "build_parser", "main", "run"]


USAGE = """examples:
  %(prog)s --demo --out demo.mp4                      # offline: a tiny random SVD built here
  %(prog)s --model ./stable-video-diffusion-img2vid-xt --image cat.png --out cat.mp4
  %(prog)s --image cat.png --out cat.gif --frames 14 --decode-chunk-size 2 --offload model
  %(prog)s --image photos/ --out videos/ --format gif  # one videos/<stem>.gif per image
  accelerate launch --multi_gpu --num_processes 2 scripts/generate_video.py --image photos/ --out videos/
      (no GPU: N CPU processes over gloo; add --device cpu to stay on CPU on a GPU machine. accelerate 1.15's
       `launch --cpu` starts a single process: see docs/video.md)

outputs:
  --image FILE:   --out x.mp4 (H.264, yuv420p), --out x.gif, or --out DIR (no suffix): DIR/frame_000.png ...
  --image FOLDER: --out is a folder; each image IMG.* gives OUT/IMG.mp4, OUT/IMG.gif or OUT/IMG/frame_000.png
                  (--format, default mp4). Two images with the same stem are refused.
  Existing outputs are replaced; a folder is only replaced if it holds nothing but frame_*.png files.
  Bad input (missing or unreadable image, a model that is not SVD, impossible sizes) exits with code 2 before
  anything is written.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``scripts/generate_video.py`` and ``hf-precision video`` (one definition for both)."""
    if p.epilog is None:  # the subcommand parser of `hf-precision video` gets the same examples and output rules
        p.epilog = USAGE
        p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--model", default=None,
                   help="local diffusers SVD folder or Hub id (default: svd = stabilityai/stable-video-diffusion-img2vid-xt)")
    p.add_argument("--image", default=None, help="input image file, or a folder of images (png, jpg, webp, bmp, tif)")
    p.add_argument("--out", default=None,
                   help="output: FILE.mp4, FILE.gif or a folder of PNG frames for one image; a folder for a folder of "
                        "images (see 'outputs' below). Default with --demo: demo.mp4")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="output format for a folder of images (default mp4); for one image it must agree with --out")
    p.add_argument("--height", type=int, default=None, help="frame height in pixels, a multiple of 8 (default 576)")
    p.add_argument("--width", type=int, default=None, help="frame width in pixels, a multiple of 8 (default 1024)")
    p.add_argument("--frames", type=int, default=None,
                   help="number of frames (default: the model's num_frames, 14 for SVD, 25 for SVD-xt)")
    p.add_argument("--steps", type=int, default=None, help="denoising steps (default 25)")
    p.add_argument("--fps", type=int, default=7, help="frames per second: the video's rate and SVD's fps conditioning (default 7)")
    p.add_argument("--motion-bucket-id", type=int, default=127, help="more motion with higher values (default 127)")
    p.add_argument("--noise-aug-strength", type=float, default=0.02,
                   help="noise added to the conditioning image; more gives more motion, less likeness (default 0.02)")
    p.add_argument("--decode-chunk-size", type=int, default=None,
                   help="frames decoded at once (default 8); 1-2 on 8 GB GPUs: the decode peak grows with it")
    p.add_argument("--offload", choices=OFFLOAD, default="none",
                   help="model: one component at a time on the accelerator (enable_model_cpu_offload); sequential: "
                        "one layer at a time (slowest, least memory; accelerators only)")
    p.add_argument("--forward-chunking", action="store_true",
                   help="UNet feed-forward in chunks (unet.enable_forward_chunking): less memory, slower")
    p.add_argument("--seed", type=int, default=0, help="random seed; the same seed gives the same video on any device")
    add_recipe_args(p, device_help="device to run on: cpu, cuda, cuda:1, mps, xpu (default: the best present device; "
                                    "under accelerate launch: each process's own device)")
    p.add_argument("--demo", action="store_true",
                   help="build a tiny random SVD pipeline locally and run it (no network, no weights)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Image-to-video with Stable Video Diffusion, in the dtypes the svd recipe picks for "
                               "your device.")
    add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Entry point of ``scripts/generate_video.py``: bad input prints one message and returns 2."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except RecipeError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2


def _check_numbers(args: argparse.Namespace) -> None:
    problems = []
    for name in ("height", "width"):
        value = getattr(args, name)
        if value is not None and (value <= 0 or value % 8):
            problems.append(f"--{name} {value}: must be a positive multiple of 8 (SVD's VAE works on 8x8 blocks; "
                            f"e.g. {max(8, round(value / 8) * 8)})")
    for name, low in (("frames", 1), ("steps", 1), ("fps", 1), ("decode_chunk_size", 1), ("motion_bucket_id", 0)):
        value = getattr(args, name)
        if value is not None and value < low:
            problems.append(f"--{name.replace('_', '-')} {value}: must be at least {low}")
    if args.noise_aug_strength < 0:
        problems.append(f"--noise-aug-strength {args.noise_aug_strength}: must be >= 0")
    if problems:
        raise RecipeError(problems)


def _demo_inputs(workdir: Path, image: str | None) -> tuple[str, str]:
    """Save a tiny random SVD pipeline and (unless one was given) a synthetic input image under ``workdir``."""
    import numpy as np
    from PIL import Image

    from ..testing.pipelines import make_svd, save_pipeline

    model = save_pipeline(make_svd(), workdir / "tiny-svd")
    if image is None:
        y, x = np.mgrid[0:128, 0:128] / 127.0
        rgb = np.stack([x, y, 1 - (x - 0.5) ** 2 * 4 * (y > 0.5)], axis=-1)
        image = str(workdir / "demo.png")
        Image.fromarray((rgb * 255).astype(np.uint8)).save(image)
    return str(model), image


def _want_cpu(device: str | None) -> bool:
    if device is not None:
        return device.split(":")[0].strip().lower() == "cpu"
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        return True
    import torch

    return not (torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available()))


def run(args: argparse.Namespace) -> int:
    """Run the video command from parsed arguments (``hf-precision video`` calls this). Raises RecipeError on bad input."""
    if args.demo and args.model:
        raise RecipeError("--demo builds its own tiny model; drop --model (or drop --demo to use your model)")
    if not args.demo and not args.image:
        raise RecipeError("--image is required (a file or a folder of images); or try --demo")
    if not args.demo and not args.out:
        raise RecipeError("--out is required: FILE.mp4, FILE.gif, or a folder")
    defaults = DEMO_DEFAULTS if args.demo else DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    _check_numbers(args)
    out = args.out or "demo.mp4"
    if not (args.image and Path(args.image).expanduser().is_dir()):
        check_out(out, args.format)  # before --demo builds its model (plan_outputs checks the rest before loading)
    if args.device is not None:
        from ..runtime.apply import torch_device

        torch_device(args.device, "--device")  # a preset such as t4 fails here, not after --demo built its model
    with contextlib.ExitStack() as stack:
        if args.demo:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hf_precision_video_")))
            model, image = _demo_inputs(workdir, args.image)
        else:
            model, image = args.model or "svd", args.image
        jobs = plan_outputs(image, out, args.format)
        if not args.demo:
            model_class(model)
        return _generate_all(args, model, jobs)


def _generate_all(args: argparse.Namespace, model: str, jobs: list[Job]) -> int:
    from accelerate import PartialState

    from ..runtime import applied as applied_record

    cpu = _want_cpu(args.device)
    # cpu=True is what makes PartialState see a CPU run started by torchrun/accelerate as MULTI_CPU (gloo).
    state = PartialState(cpu=cpu)
    distributed = state.num_processes > 1
    device = args.device
    if distributed:
        device = "cpu" if cpu else str(state.device)  # each process its own GPU
    elif device is None and os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        device = "cpu"  # `accelerate launch --cpu`
    tag = f"[process {state.process_index}/{state.num_processes}] " if distributed else ""
    say: Callable[[str], None] = lambda text: print(f"{tag}{text}", flush=True)

    with state.split_between_processes(jobs) as mine:
        mine = list(mine)  # accelerate's split: contiguous, uneven counts allowed, no image twice
    if mine:
        pipe = load_video_pipeline(model, device, overrides=overrides_from(args) or None, offload=args.offload,
                                   forward_chunking=args.forward_chunking)
        applied = applied_record(pipe)
        plans = ", ".join(f"{p.name} {p.compute}" for p in applied.recipe.plans if p.name in applied.devices)
        say(f"svd recipe for {applied.recipe.device.label()}: {plans}; offload {args.offload}")
    for job in mine:
        image = read_image(job.image)
        result = generate_video(pipe, image, height=args.height, width=args.width, frames=args.frames,
                                steps=args.steps, fps=args.fps, motion_bucket_id=args.motion_bucket_id,
                                noise_aug_strength=args.noise_aug_strength, decode_chunk_size=args.decode_chunk_size,
                                seed=args.seed, progress=not args.quiet and state.is_local_main_process,
                                desc=job.image.name)
        save_video(result.frames, job.out, fps=args.fps, format=job.format)
        n, h, w, _ = result.frames.shape
        say(f"wrote {job.out} ({n} frames, {w}x{h}, {job.format})")
        say(result.summary())
    state.wait_for_everyone()
    if state.is_main_process:
        missing = [str(j.out) for j in jobs if not j.out.exists()]
        if missing:
            print(f"error: {len(missing)} output(s) missing: {', '.join(missing)}", file=sys.stderr)
            return 1
        if len(jobs) > 1 or distributed:
            say(f"done: {len(jobs)} video(s) from {state.num_processes} process(es) in {jobs[0].out.parent}")
    return 0



@command("video", "image-to-video with Stable Video Diffusion: mp4, gif or PNG frames (try --demo)",
         "hf_precision.cli.video:run")
def _args_video(p: argparse.ArgumentParser) -> None:
    add_arguments(p)
